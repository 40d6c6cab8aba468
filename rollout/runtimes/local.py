"""The `local` runtime: a private session directory on this machine, each command in its own process group.

`<sessions_root>/<session_id>/` holds `home/` (HOME of every process), `workspace/` (the default working
directory), `artifacts/` and `logs/` (with `logs/agent/`). The directory stays after teardown: its logs
are what a SessionResult points at. A command sees the env it is given on top of a few host basics
(PATH, locale, terminal), never the rest of the host's environment (credentials included). Every
process group started is listed in `process-groups.jsonl` there before its command runs, so that another
process can end the groups if this one dies (a node's Ray actor killed mid-run).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from tracetap.rollout.models import RuntimeSpec
from tracetap.rollout.runtimes.base import ExecResult, SessionLayout
from tracetap.rollout.runtimes.processes import GROUPS_FILE, end_group, record_group
from tracetap.store import validate_session_id

HOST_BASICS = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR")
KILL_GRACE_SECONDS = 3.0
TIMED_OUT = -1
# The command waits until its group is recorded: if this process dies first, the read meets EOF and it exits.
GATE = "read -r || exit 97\n"


def local_layout(session_dir: Path) -> SessionLayout:
    logs = session_dir / "logs"
    return SessionLayout(root=str(session_dir), home=str(session_dir / "home"),
                         workspace=str(session_dir / "workspace"), artifacts=str(session_dir / "artifacts"),
                         logs=str(logs), agent_logs=str(logs / "agent"))


def login_command(command: str, path: str | None) -> str:
    """`bash -lc` sources /etc/profile, which resets PATH: set the given PATH again before the command."""
    return command if path is None else f"export PATH={shlex.quote(path)}\n{command}"


def exit_code(returncode: int) -> int:
    """A death by signal N as the shell reports it (128 + N), so -1 only ever means a timeout."""
    return 128 - returncode if returncode < 0 else returncode


class RuntimeClosed(RuntimeError):
    """A command or upload after teardown: the session is over."""


class LocalRuntime:
    """Implements `runtimes.base.Runtime` with host paths; every process group it starts ends at teardown."""

    def __init__(self, sessions_root: Path | str, session_id: str, spec: RuntimeSpec | None = None,
                 kill_grace: float = KILL_GRACE_SECONDS) -> None:
        self.session_dir = Path(sessions_root).resolve() / validate_session_id(session_id)
        self.layout = local_layout(self.session_dir)
        self.workdir = (spec.workdir if spec else None) or self.layout.workspace
        self.kill_grace = kill_grace
        self.groups: set[int] = set()  # process group ids (= leader pids) of every command started
        self.closed = False

    async def start(self) -> None:
        for folder in (self.layout.home, self.layout.workspace, self.layout.artifacts, self.layout.agent_logs):
            Path(folder).mkdir(parents=True, exist_ok=True)

    async def exec(self, command: str, *, env: Mapping[str, str], log_name: str, cwd: str | None = None,
                   timeout: float | None = None) -> ExecResult:
        stdout_path, stderr_path = self._log_paths(log_name)
        started = time.monotonic()
        process = await self._spawn(command, env, cwd, stdout_path, stderr_path)
        try:
            returncode = exit_code(await asyncio.wait_for(process.wait(), timeout))
        except TimeoutError:
            await end_group(process.pid, self.kill_grace)
            await process.wait()
            returncode = TIMED_OUT
        except asyncio.CancelledError:
            await asyncio.shield(end_group(process.pid, self.kill_grace))
            raise
        return ExecResult(returncode, stdout_path, stderr_path, time.monotonic() - started)

    async def _spawn(self, command: str, env: Mapping[str, str], cwd: str | None, stdout_path: Path,
                     stderr_path: Path) -> asyncio.subprocess.Process:
        if self.closed:
            raise RuntimeClosed(f"the runtime of {self.session_dir.name} is torn down")
        full_env = self._env(env)
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            process = await asyncio.create_subprocess_exec(
                "bash", "-lc", GATE + login_command(command, full_env.get("PATH")), cwd=self._cwd(cwd),
                env=full_env, stdin=asyncio.subprocess.PIPE, stdout=out, stderr=err, start_new_session=True)
        self.groups.add(process.pid)
        record_group(self.session_dir / GROUPS_FILE, process.pid)
        assert process.stdin is not None  # stdin=PIPE
        process.stdin.write(b"go\n")  # the gate opens; then stdin is at its end, as /dev/null would be
        process.stdin.close()
        return process

    def _cwd(self, cwd: str | None) -> Path:
        """The working directory; a relative one is in the workspace (as in a container)."""
        return Path(self.layout.workspace) / (cwd or self.workdir)

    def _env(self, env: Mapping[str, str]) -> dict[str, str]:
        basics = {name: os.environ[name] for name in HOST_BASICS if name in os.environ}
        return {**basics, "HOME": self.layout.home, **env}

    def _log_paths(self, log_name: str) -> tuple[Path, Path]:
        base = self._inside(Path(self.layout.logs), log_name)
        base.parent.mkdir(parents=True, exist_ok=True)
        return base.with_name(base.name + ".stdout.log"), base.with_name(base.name + ".stderr.log")

    def _inside(self, folder: Path, relative: str) -> Path:
        """`relative` under `folder` (absolute paths are taken as they are), refused outside the session."""
        path = (folder / relative).resolve()
        if not path.is_relative_to(self.session_dir):
            raise ValueError(f"{relative!r} is outside the session directory {self.session_dir}")
        return path

    def host_path(self, target: str) -> Path:
        """A runtime path as a host path: relative paths are in the workspace; nothing outside the session."""
        return self._inside(Path(self.layout.workspace), target)

    async def upload(self, source: Path, target: str) -> None:
        if self.closed:
            raise RuntimeClosed(f"the runtime of {self.session_dir.name} is torn down")
        destination, source = self.host_path(target), Path(source)
        if not source.exists():
            raise FileNotFoundError(f"upload source {source} does not exist")
        await asyncio.to_thread(_copy, source, destination)

    async def write_text(self, target: str, text: str) -> None:
        destination = self.host_path(target)
        destination.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(destination.write_text, text)

    async def read_text(self, target: str) -> str:
        return await asyncio.to_thread(self.host_path(target).read_text, errors="replace")

    async def teardown(self) -> None:
        self.closed = True
        groups, self.groups = list(self.groups), set()
        await asyncio.gather(*(end_group(pgid, self.kill_grace) for pgid in groups))


def _copy(source: Path, destination: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, destination, dirs_exist_ok=True)
        return
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, destination)
