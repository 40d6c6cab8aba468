"""The local runtime with real bash processes: folders, logs, env, timeouts and teardown by process group."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from tracetap.rollout.models import RuntimeSpec
from tracetap.rollout.runtimes import RuntimeUnavailable, create_runtime
from tracetap.rollout.runtimes.local import LocalRuntime
from tracetap.rollout.runtimes.processes import GROUPS_FILE, end_recorded_groups, is_alive
from tracetap.store import InvalidSessionId

SID = "sk-tap-runtime-1"


def run(coro):
    return asyncio.run(coro)


async def started(root: Path, **kwargs) -> LocalRuntime:
    runtime = LocalRuntime(root, SID, **kwargs)
    await runtime.start()
    return runtime


def wait_for_file(path: Path, seconds: float = 10.0) -> str:
    deadline = time.monotonic() + seconds
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} was never written"
        time.sleep(0.02)
    return path.read_text()


def test_layout_and_logs(tmp_path: Path) -> None:
    async def scenario():
        runtime = await started(tmp_path)
        result = await runtime.exec("pwd; echo $HOME; echo oops >&2; exit 3", env={}, log_name="agent/step")
        return runtime, result

    runtime, result = run(scenario())
    session = tmp_path.resolve() / SID
    assert {p.name for p in session.iterdir()} == {"home", "workspace", "artifacts", "logs", GROUPS_FILE}
    assert (session / "logs" / "agent").is_dir()
    assert result.returncode == 3 and not result.timed_out
    assert result.stdout_path == session / "logs" / "agent" / "step.stdout.log"
    assert result.stdout_path.read_text().split() == [str(session / "workspace"), str(session / "home")]
    assert result.stderr_path.read_text() == "oops\n"


def test_env_is_what_it_is_given_plus_host_basics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "host-secret")
    monkeypatch.setenv("PATH", f"/opt/custom-bin{os.pathsep}{os.environ['PATH']}")

    async def scenario():
        runtime = await started(tmp_path)
        return await runtime.exec('echo "$PATH|${AWS_SECRET_ACCESS_KEY:-unset}|$GIVEN"', env={"GIVEN": "yes"},
                                  log_name="env")

    out = run(scenario()).stdout_path.read_text().strip()
    path, secret, given = out.split("|")
    assert path.startswith("/opt/custom-bin")  # survives the login shell's /etc/profile
    assert secret == "unset" and given == "yes"


def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"

    async def scenario():
        runtime = await started(tmp_path, kill_grace=0.5)
        return await runtime.exec(f"sleep 300 & echo $! > {pid_file}; wait", env={}, log_name="slow",
                                  timeout=0.5)

    result = run(scenario())
    assert result.returncode == -1 and result.timed_out
    assert not is_alive(int(pid_file.read_text()))


def test_a_signal_death_is_not_a_timeout(tmp_path: Path) -> None:
    async def scenario():
        runtime = await started(tmp_path)
        return await runtime.exec("kill -KILL $$", env={}, log_name="killed")

    assert run(scenario()).returncode == 128 + 9  # SIGKILL: it cannot be ignored, even under nohup


def test_teardown_ends_background_processes_that_ignore_sigterm(tmp_path: Path) -> None:
    pid_file = tmp_path / "stubborn.pid"

    async def scenario():
        runtime = await started(tmp_path, kill_grace=0.3)
        await runtime.exec(f"(trap '' TERM; exec sleep 300) & echo $! > {pid_file}", env={}, log_name="bg")
        pid = int(wait_for_file(pid_file))
        alive_before = is_alive(pid)
        await runtime.teardown()
        with pytest.raises(RuntimeError, match="torn down"):
            await runtime.exec("true", env={}, log_name="late")
        await runtime.teardown()  # idempotent
        return pid, alive_before

    pid, alive_before = run(scenario())
    assert alive_before and not is_alive(pid)


def test_recorded_groups_are_ended_by_another_caller_only_while_they_are_the_ones_recorded(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    runtime = run(started(tmp_path))
    # the leader exits at once; its background child stays in the group (a runtime whose node died)
    run(runtime.exec(f"sleep 300 & echo $! > {pid_file}", env={}, log_name="bg"))
    child = int(wait_for_file(pid_file))
    groups_file = runtime.session_dir / GROUPS_FILE
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:  # a live group under a recorded id but started at another time: a reused pid, not the session's
        record = {**json.loads(groups_file.read_text()), "pgid": stranger.pid, "start": 1}
        with open(groups_file, "a") as out:
            out.write(json.dumps(record) + "\n")
        assert run(end_recorded_groups(groups_file, 0.3)) == 1
        assert not is_alive(child) and stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_cancelled_exec_ends_its_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "leader.pid"

    async def scenario():
        runtime = await started(tmp_path, kill_grace=0.3)
        task = asyncio.create_task(runtime.exec(f"echo $$ > {pid_file}; sleep 300", env={}, log_name="c"))
        await asyncio.to_thread(wait_for_file, pid_file)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())
    assert not is_alive(int(pid_file.read_text()))


def test_uploads_stay_inside_the_session(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "a.py").write_text("A = 1\n")
    (tmp_path / "one.txt").write_text("one")

    async def scenario():
        runtime = await started(tmp_path / "sessions")
        await runtime.upload(source, ".")
        await runtime.upload(tmp_path / "one.txt", "data/one.txt")
        await runtime.write_text(f"{runtime.layout.home}/.config/x.json", "{}")
        with pytest.raises(ValueError, match="outside the session"):
            await runtime.upload(tmp_path / "one.txt", "../../escape.txt")
        with pytest.raises(ValueError, match="outside the session"):
            await runtime.exec("true", env={}, log_name="../../x")
        return runtime

    runtime = run(scenario())
    workspace = Path(runtime.layout.workspace)
    assert (workspace / "pkg" / "a.py").read_text() == "A = 1\n"
    assert (workspace / "data" / "one.txt").read_text() == "one"
    assert (Path(runtime.layout.home) / ".config" / "x.json").read_text() == "{}"
    assert not (tmp_path / "escape.txt").exists()


def test_session_ids_are_checked_before_they_become_paths(tmp_path: Path) -> None:
    with pytest.raises(InvalidSessionId):
        LocalRuntime(tmp_path, "../escape")
    assert not any(tmp_path.iterdir())


def test_factory(tmp_path: Path) -> None:
    assert isinstance(create_runtime(RuntimeSpec(), tmp_path, SID), LocalRuntime)
    with pytest.raises(RuntimeUnavailable, match="needs a gateway node"):
        create_runtime(RuntimeSpec(backend="docker", image="python:3.12"), tmp_path, SID)


def test_read_text_and_a_relative_cwd_are_in_the_workspace(tmp_path: Path) -> None:
    async def scenario():
        runtime = await started(tmp_path)
        await runtime.write_text("repo/notes.txt", "hello")
        where = await runtime.exec("pwd", env={}, log_name="pwd", cwd="repo")
        with pytest.raises(FileNotFoundError):
            await runtime.read_text("repo/none.txt")
        with pytest.raises(ValueError, match="outside the session"):
            await runtime.read_text("/etc/hostname")
        return await runtime.read_text("repo/notes.txt"), where.stdout_path.read_text().strip()

    text, cwd = run(scenario())
    assert text == "hello" and cwd == str(tmp_path.resolve() / SID / "workspace" / "repo")
