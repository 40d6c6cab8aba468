"""What an evaluator may do in a session's runtime: run a command, read a file, copy files in.

Evaluators are synchronous (they run in a thread during POSTRUN); the rollout node hands them an object
with this shape that bridges to its asynchronous runtime. Paths are paths as the runtime's processes see
them. Offline scoring (`tracetap evaluate`) has no runtime: `EvalInput.runtime` is None there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tracetap.evaluators.base import EvaluatorError

TIMED_OUT = -1


@dataclass(frozen=True)
class CommandResult:
    returncode: int  # -1 when the command ran out of time
    stdout: str
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.returncode == TIMED_OUT


class EvalRuntime(Protocol):
    scratch: str  # a folder inside the runtime for the evaluator's own files (patches, scripts)

    def exec(self, command: str, *, timeout: float, log_name: str, env: Mapping[str, str] | None = None,
             cwd: str | None = None) -> CommandResult:
        """Run `bash -lc command`; its output is also kept in the session's `logs/<log_name>.*.log`."""

    def read_text(self, path: str) -> str:
        """A file's text (FileNotFoundError when it is not there)."""

    def write_text(self, path: str, text: str) -> None:
        """Write a file inside the runtime."""

    def upload(self, source: Path, target: str) -> None:
        """Copy a host file or folder to `target` inside the runtime."""


def require(runtime: EvalRuntime | None, evaluator: str, what: str = "the session's runtime") -> EvalRuntime:
    """`runtime`, or the error saying this evaluator runs only in a rollout (never offline)."""
    if runtime is None:
        raise EvaluatorError(f"{evaluator}: needs {what}; it runs only in a rollout (POSTRUN), not offline")
    return runtime
