"""The runtime contract: where one session's processes run (a private directory, a container).

A node drives a runtime through four calls: `start`, `exec`, `upload`/`write_text`/`read_text`, `teardown`. Every
command runs as `bash -lc COMMAND`; paths given to a runtime are paths as its processes see them (the
`layout` tells which), so the same harness steps work on the host and in a container.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class SessionLayout:
    """A session's folders, as the runtime's processes see them (host paths for `local`)."""

    root: str        # the session directory
    home: str        # HOME for every process
    workspace: str   # default working directory
    artifacts: str
    logs: str
    agent_logs: str  # logs/agent


@dataclass(frozen=True)
class ExecResult:
    returncode: int     # -1 when the command ran out of time
    stdout_path: Path   # host paths of its output
    stderr_path: Path
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode == -1


class Runtime(Protocol):
    session_dir: Path  # host path of the session directory (logs are read from here)
    layout: SessionLayout

    async def start(self) -> None:
        """Create the session's folders (and container); idempotent."""

    async def exec(self, command: str, *, env: Mapping[str, str], log_name: str, cwd: str | None = None,
                   timeout: float | None = None) -> ExecResult:
        """Run `bash -lc command`; output goes to `<logs>/<log_name>.{stdout,stderr}.log`."""

    async def upload(self, source: Path, target: str) -> None:
        """Copy a host file or folder to `target` inside the runtime."""

    async def write_text(self, target: str, text: str) -> None:
        """Write a file inside the runtime (harness configs)."""

    async def read_text(self, target: str) -> str:
        """A file's text from inside the runtime (evaluators); FileNotFoundError when it is not there."""

    async def teardown(self) -> None:
        """End every process this runtime started (by pid or container id); idempotent."""


class RuntimeUnavailable(ValueError):
    """A runtime this node cannot give the session: an unknown backend, no engine, a missing image."""
