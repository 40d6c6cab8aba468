"""What the rollout server needs from a gateway node, in-process or as a Ray actor.

Every method is async so one node class serves both: the server awaits it directly, or awaits the
ObjectRef of the same call on a Ray actor. `run_session` returns when the session has ended (its
result is already persisted by then); a node that dies surfaces as an exception from that await.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel
from tracetap.rollout.models import SessionContext, SessionResult, SessionStatus


class NodeStats(BaseModel):
    node_id: str
    max_init_workers: int
    max_run_workers: int
    max_postrun_workers: int
    init_queue_depth: int = 0
    init_inflight: int = 0
    ready_depth: int = 0
    run_inflight: int = 0
    postrun_queue_depth: int = 0
    postrun_inflight: int = 0

    @property
    def total_sessions(self) -> int:
        return (self.init_queue_depth + self.init_inflight + self.ready_depth + self.run_inflight
                + self.postrun_queue_depth + self.postrun_inflight)

    @property
    def admission_limit(self) -> int:
        """INIT + READY (bounded by the run workers) + RUN + POSTRUN slots (reference system §5.2)."""
        return self.max_init_workers + 2 * self.max_run_workers + self.max_postrun_workers


@dataclass(frozen=True)
class GatewayAnswer:
    """What a node's gateway answered an admin call: several nodes may share one gateway (`url`)."""

    url: str
    status: int
    body: dict


class Node(Protocol):
    async def node_id(self) -> str: ...

    async def run_session(self, session: SessionContext) -> SessionResult:
        """Run one session through INIT, READY, RUNNING, POSTRUN; a known session id raises KeyError."""

    async def cancel(self, session_id: str) -> bool:
        """Tear the session down and end it CANCELLED; False when it is unknown or already over."""

    async def statuses(self) -> dict[str, SessionStatus]:
        """The status of every session this node holds that has not ended."""

    async def stats(self) -> NodeStats: ...

    async def gateway_admin(self, action: str, body: dict | None) -> GatewayAnswer:
        """Send a fencing call (`pause`, `resume`, `status`) to the node's gateway; its URL and answer."""

    async def shutdown(self) -> None:
        """Cancel what runs, stop the node's gateway; idempotent."""


class SessionNotStarted(RuntimeError):
    """The node was lost before the session's INIT began: the server sends it to another node."""


class NodeLost(RuntimeError):
    """The node is gone (its Ray actor died or stopped answering): it takes no more sessions."""


NODE_LOST = "node_lost"  # SessionResult.error of a session whose node died while it ran
