"""Which node takes the next session: stage pressure, as the reference system's balancer does (§5.2).

A node is eligible while its sessions (its own count plus what was dispatched to it and not yet seen
in its stats: the reservations) stay below its admission limit and its POSTRUN backlog is below twice
its POSTRUN workers. Among eligible nodes the least loaded wins, comparing run pressure first, then
POSTRUN, INIT (with reservations), the READY gap, total pressure and finally the node id.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from tracetap.rollout.node_api import Node, NodeLost, NodeStats


def pressure(stats: NodeStats, reserved: int) -> tuple:
    init = (stats.init_queue_depth + stats.init_inflight + reserved) / stats.max_init_workers
    ready_gap = stats.max_run_workers - stats.ready_depth
    total = (stats.total_sessions + reserved) / stats.admission_limit
    return (stats.run_inflight / stats.max_run_workers,
            (stats.postrun_queue_depth + stats.postrun_inflight) / stats.max_postrun_workers,
            init, -ready_gap, total, stats.node_id)


def eligible(stats: NodeStats, held: int) -> bool:
    """`held`: sessions the server has dispatched to this node and not seen end."""
    backlog = stats.postrun_queue_depth < 2 * stats.max_postrun_workers
    return max(held, stats.total_sessions) < stats.admission_limit and backlog


class NodePool:
    """The nodes sessions can go to; `acquire` waits until one is eligible, `release` when its session ends."""

    def __init__(self, nodes: dict[str, Node]) -> None:
        self.nodes = dict(nodes)
        self.held: Counter[str] = Counter()
        self._changed = asyncio.Condition()

    async def acquire(self) -> str:
        async with self._changed:
            while True:
                chosen = await self._choose()
                if chosen is not None:
                    self.held[chosen] += 1
                    return chosen
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=0.5)
                except TimeoutError:
                    pass

    async def release(self, node_id: str) -> None:
        async with self._changed:
            self.held[node_id] -= 1
            self._changed.notify_all()

    async def remove(self, node_id: str) -> None:
        """A node that was lost takes no more sessions."""
        async with self._changed:
            self.nodes.pop(node_id, None)
            self._changed.notify_all()

    async def stats(self) -> list[NodeStats]:
        return [stats for stats in (await self._all_stats()).values() if stats is not None]

    async def _choose(self) -> str | None:
        answers = await self._all_stats()
        if not self.nodes:
            raise NoNodes("no gateway node is left to run sessions")
        candidates = []
        for node_id, stats in answers.items():
            if stats is None:
                continue
            reserved = max(0, self.held[node_id] - stats.total_sessions)
            if eligible(stats, self.held[node_id]):
                candidates.append((pressure(stats, reserved), node_id))
        return min(candidates)[1] if candidates else None

    async def _all_stats(self) -> dict[str, NodeStats | None]:
        """Each node's stats, None when it failed to answer; a node found lost leaves the pool."""
        ids = list(self.nodes)
        found = await asyncio.gather(*(self.nodes[i].stats() for i in ids), return_exceptions=True)
        for node_id, answer in zip(ids, found, strict=True):
            if isinstance(answer, NodeLost):
                self.nodes.pop(node_id, None)
        return {node_id: answer if isinstance(answer, NodeStats) else None
                for node_id, answer in zip(ids, found, strict=True) if node_id in self.nodes}


class NoNodes(RuntimeError):
    """Every node is gone: sessions still waiting end ERROR rather than hang."""
