"""The server's own nodes: N GatewayNodes in this process sharing one gateway (one writer per store).

`local_manager(config)` starts the gateway (embedded engine, `--script`, or `--upstream`), the nodes
and the manager, and stops them all, by pid, when the block ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from tracetap.rollout.gateway_host import GatewayHost
from tracetap.rollout.manager import RolloutManager
from tracetap.rollout.node import GatewayNode, NodeConfig
from tracetap.rollout.results import ResultStore
from tracetap.rollout.scheduler import NodePool


@dataclass(frozen=True)
class ClusterConfig:
    store: Path
    nodes: int = 1
    init_workers: int = 2
    run_workers: int = 2
    postrun_workers: int = 1
    sessions_root: Path | None = None
    gateway_args: tuple[str, ...] = ()  # for `tracetap gateway`: --script FILE, --upstream URL, ...

    def node_config(self, node_id: str, gateway_url: str) -> NodeConfig:
        return NodeConfig(store=self.store, sessions_root=self.sessions_root, node_id=node_id,
                          init_workers=self.init_workers, run_workers=self.run_workers,
                          postrun_workers=self.postrun_workers, gateway_url=gateway_url)


@asynccontextmanager
async def local_manager(config: ClusterConfig) -> AsyncIterator[RolloutManager]:
    if config.nodes < 1:
        raise ValueError("a rollout server needs at least one node")
    Path(config.store).mkdir(parents=True, exist_ok=True)
    gateway = GatewayHost(Path(config.store), None, config.gateway_args)
    url = await gateway.start()
    nodes = {f"node-{n}": GatewayNode(config.node_config(f"node-{n}", url)) for n in range(config.nodes)}
    manager = RolloutManager(NodePool(nodes), ResultStore(Path(config.store)))
    try:
        yield manager
    finally:
        await manager.close()
        for node in nodes.values():
            await node.shutdown()
        await gateway.stop()
