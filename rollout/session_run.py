"""One session's state on a node: where it is in the pipeline, its budget, runtime, and stage timestamps.

The timeline holds unix times of `queued`, `init_start`, `init_end`, `ready`, `run_start`, `run_end`,
`postrun_start`, `postrun_end` and `end` (those the session reached; plus `eval_runtime_start` and
`eval_runtime_ready` when its evaluator asked for a fresh runtime): the Timing of its result is
derived from it, and it is returned whole so overlap between sessions can be measured.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from tracetap.rollout.harnesses.base import HarnessContext
from tracetap.rollout.models import SessionContext, SessionResult, SessionStatus, TaskRequest, Timing
from tracetap.rollout.runtimes.base import Runtime

if TYPE_CHECKING:
    from tracetap.rollout.eval_runtime import FreshRuntime


class Stage(StrEnum):
    QUEUED = "queued"                  # waiting for an INIT worker
    INIT = "init"                      # runtime start, registration, prepare; then waiting for a READY slot
    READY = "ready"                    # prepared, holding a READY slot until a RUN worker takes it
    RUN = "run"
    POSTRUN_QUEUED = "postrun_queued"  # waiting for a POSTRUN worker
    POSTRUN = "postrun"
    DONE = "done"


class StageFailure(Exception):
    """A stage ends the session with `status` (ERROR or TIMEOUT) and this message."""

    def __init__(self, status: SessionStatus, message: str):
        super().__init__(message)
        self.status = status


def _span_ms(timeline: dict[str, float], start: str, end: str) -> float | None:
    if start not in timeline or end not in timeline:
        return None
    return round((timeline[end] - timeline[start]) * 1000, 3)


@dataclass
class SessionRun:
    ctx: SessionContext
    done: asyncio.Future
    stage: Stage = Stage.QUEUED
    status: SessionStatus = SessionStatus.REGISTERED
    timeline: dict[str, float] = field(default_factory=dict)
    deadline: float | None = None  # event-loop time at which the budget ends (set when INIT starts)
    runtime: Runtime | None = None
    fresh: FreshRuntime | None = None  # the evaluation runtime, when the evaluator asks for one
    harness_ctx: HarnessContext | None = None
    registered: bool = False
    verdict: SessionStatus = SessionStatus.COMPLETED  # what RUN leaves POSTRUN: COMPLETED, TIMEOUT or ERROR
    error: str | None = None
    work: asyncio.Task | None = None  # the stage work being executed, cancelled by a cancel
    began: asyncio.Event = field(default_factory=asyncio.Event)  # set when it leaves the queue (INIT starts)
    holds_ready_slot: bool = False
    traces: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reward: float | None = None

    @property
    def session_id(self) -> str:
        return self.ctx.session_id

    @property
    def task(self) -> TaskRequest:
        return self.ctx.task

    def mark(self, event: str) -> None:
        self.timeline[event] = time.time()

    def enter(self, stage: Stage, status: SessionStatus, event: str) -> None:
        self.stage, self.status = stage, status
        self.began.set()
        self.mark(event)

    def budget_end(self) -> float:
        """The event-loop time at which the budget ends."""
        assert self.deadline is not None, "the budget starts with INIT"
        return self.deadline

    def remaining(self) -> float:
        """Seconds left of the budget (0 once spent)."""
        return max(0.0, self.budget_end() - asyncio.get_running_loop().time())

    def prepared(self) -> tuple[Runtime, HarnessContext]:
        """The runtime and harness context INIT made: RUN, POSTRUN and evaluation only follow a complete INIT."""
        assert self.runtime is not None and self.harness_ctx is not None, "INIT prepares the session"
        return self.runtime, self.harness_ctx

    def timing(self) -> Timing:
        line = self.timeline
        return Timing(queued_ms=_span_ms(line, "queued", "init_start"),
                      init_ms=_span_ms(line, "init_start", "init_end"), run_ms=_span_ms(line, "run_start", "run_end"),
                      postrun_ms=_span_ms(line, "postrun_start", "postrun_end"))

    def logs(self) -> dict[str, str]:
        """Every log file of the session: name relative to its logs folder -> host path."""
        if self.runtime is None:
            return {}
        folder = Path(self.runtime.session_dir) / "logs"
        return {str(path.relative_to(folder)): str(path) for path in sorted(folder.rglob("*.log"))}

    def result(self, node_id: str) -> SessionResult:
        return SessionResult(session_id=self.session_id, task_id=self.task.task_id, status=self.status,
                             reward=self.reward, traces=self.traces, prompt_tokens=self.prompt_tokens,
                             completion_tokens=self.completion_tokens, timing=self.timing(), node_id=node_id,
                             error=self.error, logs=self.logs(), timeline=dict(self.timeline),
                             finished_at=datetime.now(UTC))
