"""Weight-update fencing: a trainer pauses the gateway, updates the engines' weights, and resumes it with the
new policy version, so no call mixes two policies and every call names the version that sampled it.

While paused, a new generation call waits up to `wait_seconds` for the resume (`admit`), then gets a 503
with `Retry-After` (in its API's shape: the service renders `Paused`). Calls already sent upstream either finish
or, when the pause asks for it, are cancelled: the upstream connection is closed, which makes vLLM and SGLang
abort the request, and the service records the call as aborted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
RETRY_AFTER = 5  # seconds a paused gateway tells callers to wait before retrying


class Paused(Exception):
    """The gateway stayed paused for as long as a new call may wait."""


class Aborted(Exception):
    """A pause cancelled this call while it was upstream."""


@dataclass(eq=False)
class _Flight:
    """A call upstream: the task awaiting it, and whether a pause cancelled that task."""

    task: asyncio.Task
    aborted: bool = False


@dataclass(frozen=True)
class FenceStatus:
    paused: bool
    policy_version: str | None
    waiting: int
    in_flight: int

    def to_json(self) -> dict:
        return {"paused": self.paused, "policy_version": self.policy_version, "waiting": self.waiting,
                "in_flight": self.in_flight}


class Fence:
    """Gates every upstream generation call; one per gateway (all on the gateway's event loop)."""

    def __init__(self, policy_version: str | None = None, wait_seconds: float = 60.0) -> None:
        self.policy_version = policy_version
        self.wait_seconds = wait_seconds
        self._open = asyncio.Event()
        self._open.set()
        self._waiting = 0
        self._in_flight: set[_Flight] = set()

    async def admit(self) -> str | None:
        """Wait while paused (up to `wait_seconds`, then Paused); the policy version the call is sent under."""
        if not self._open.is_set():
            self._waiting += 1
            try:
                await asyncio.wait_for(self._open.wait(), self.wait_seconds)
            except TimeoutError:
                raise Paused(f"the gateway is paused for a weight update; retry in {RETRY_AFTER} s") from None
            finally:
                self._waiting -= 1
        return self.policy_version

    async def upstream(self, call: Awaitable[T]) -> T:
        """`call`, counted in flight; Aborted when a pause cancels it (a caller's own cancel propagates).

        Awaited in the caller's task, not a task of its own (one less task and loop turn per call: ~0.03 ms
        of a lone call); a pause cancels that task, and the cancel is taken back here (`uncancel`)."""
        task = asyncio.current_task()
        assert task is not None, "the fence runs on the gateway's event loop"
        flight = _Flight(task)
        self._in_flight.add(flight)
        try:
            return await call
        except asyncio.CancelledError:
            if flight.aborted and task.uncancel() == 0:  # the pause's cancel, and no other
                raise Aborted("aborted by a pause of the gateway for a weight update") from None
            raise
        finally:
            self._in_flight.discard(flight)

    def pause(self, abort: bool = False) -> int:
        """Stop admitting calls; with `abort`, cancel those upstream. Returns how many were cancelled."""
        self._open.clear()
        if not abort:
            return 0
        for flight in self._in_flight:
            flight.aborted = True
            flight.task.cancel()
        return len(self._in_flight)

    def resume(self, policy_version: str | None) -> None:
        """Admit calls again, under `policy_version` (kept as it was when None)."""
        if policy_version is not None:
            self.policy_version = policy_version
        self._open.set()

    def status(self) -> FenceStatus:
        return FenceStatus(not self._open.is_set(), self.policy_version, self._waiting, len(self._in_flight))
