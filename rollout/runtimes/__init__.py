"""Runtimes by `RuntimeSpec.backend` name: `create_runtime` picks one for a session."""

from __future__ import annotations

from pathlib import Path

from tracetap.rollout.models import RuntimeSpec
from tracetap.rollout.runtimes.base import Runtime
from tracetap.rollout.runtimes.local import LocalRuntime


class RuntimeUnavailable(ValueError):
    """A backend the task names that this node cannot run."""


def create_runtime(spec: RuntimeSpec, sessions_root: Path | str, session_id: str) -> Runtime:
    """The runtime of one session; docker and podman are refused with a clear reason (for now)."""
    if spec.backend == "local":
        return LocalRuntime(sessions_root, session_id, spec)
    raise RuntimeUnavailable(f"runtime backend {spec.backend!r} is not available yet: container runtimes "
                             "come with the next issue; use backend 'local'")
