"""The harness presets without npm: configs in a private HOME, scripts the engine plays, binaries, runs.

The real CLIs run in the `harness` tier (tests/harness); here each preset's files, env and script are
checked, and `run_harness` drives a small shell script standing in for a CLI (exit codes, timeouts,
process-group cleanup).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from tracetap.engine.script import Script

from tracetap import harnesses
from tracetap.harnesses import HARNESSES, SIDE_REPLY, HarnessError

GATEWAY = "http://127.0.0.1:9"
SID = "sk-tap-unit-1"
BASE = f"{GATEWAY}/s/{SID}"


def read_config(home: Path, name: str) -> str:
    """Every file the preset wrote under its HOME, as one text (configs differ in format)."""
    files = sorted(p for p in home.rglob("*") if p.is_file())
    for path in files:
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".toml":
            tomllib.loads(path.read_text())
    return "\n".join(p.read_text() for p in files)


@pytest.mark.parametrize("name", list(HARNESSES))
def test_each_preset_points_its_cli_at_the_session(name: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-secret")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-real-secret")
    home = tmp_path / "home"
    env = harnesses.harness_env(HARNESSES[name], home, GATEWAY, SID)
    text = read_config(home, name) + "\n" + json.dumps(env)
    assert BASE in text  # the session's path prefix: binds every call, whatever headers the CLI adds
    assert SID in text and "sk-real-secret" not in text
    assert env["HOME"] == str(home) and env["npm_config_offline"] == "true"


def test_script_keeps_side_calls_off_the_main_loop(tmp_path: Path) -> None:
    harness = HARNESSES["codex"]
    path = harnesses.write_script(tmp_path / "s.jsonl", harness, ["ls", "echo hi"], "Finished.")
    script = Script.load(path)
    assert script.next_reply("s", has_tools=True)["tool_calls"][0]["function"] == {
        "name": "exec_command", "arguments": {"cmd": "ls"}}
    assert script.next_reply("s", has_tools=False)["content"] == SIDE_REPLY  # e.g. a title call
    assert script.next_reply("s", has_tools=True)["tool_calls"][0]["function"]["arguments"] == {"cmd": "echo hi"}
    assert [script.next_reply("s", has_tools=True)["content"] for _ in range(2)] == ["Finished."] * 2


def fake_cli(folder: Path, name: str, body: str) -> Path:
    path = folder / "node_modules" / ".bin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_binaries_come_from_the_npm_dir_else_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    pi = fake_cli(tmp_path / "npm", "pi", "exit 0")
    assert harnesses.require_binary(HARNESSES["pi"], tmp_path / "npm") == pi
    harnesses.install([HARNESSES["pi"]], tmp_path / "npm")  # installed already: npm is not needed
    with pytest.raises(HarnessError, match=r"npm install --prefix \S+ .*@openai/codex"):
        harnesses.require_binary(HARNESSES["codex"], tmp_path / "npm")


def test_run_reports_exit_code_and_output(tmp_path: Path) -> None:
    cli = fake_cli(tmp_path / "npm", "pi", 'echo "home=$HOME"; pwd; echo oops >&2; exit 3')
    workspace = tmp_path / "ws"
    workspace.mkdir()
    run = harnesses.run_harness(HARNESSES["pi"], cli, GATEWAY, SID, "task", workspace, tmp_path / "home")
    assert (run.returncode, run.timed_out) == (3, False)
    assert run.stdout.split() == [f"home={tmp_path / 'home'}", str(workspace)] and run.stderr == "oops\n"
    with pytest.raises(HarnessError, match="exited with 3"):
        harnesses.check(run)


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    cli = fake_cli(tmp_path / "npm", "pi", f"sleep 60 & echo $! > {pid_file}; sleep 60")
    started = time.monotonic()
    run = harnesses.run_harness(HARNESSES["pi"], cli, GATEWAY, SID, "task", tmp_path, tmp_path / "home",
                                timeout=1.0)
    assert run.timed_out and run.returncode is None and time.monotonic() - started < 10
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
    with pytest.raises(HarnessError, match="timed out"):
        harnesses.check(run)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split()[2] == "Z")  # a zombie is dead


def test_demo_without_the_cli_says_how_to_install_it(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    out.mkdir()
    (out / "keep.txt").write_text("untouched")
    env = {**os.environ, "TRACETAP_NPM_DIR": str(tmp_path / "npm"), "PATH": str(tmp_path / "empty")}
    done = subprocess.run([sys.executable, "-m", "tracetap.cli", "demo", "--harness", "gemini-cli",
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "`gemini` is not installed" in done.stderr and "@google/gemini-cli" in done.stderr
    assert (out / "keep.txt").read_text() == "untouched"  # checked before the folder is replaced
