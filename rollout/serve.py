"""Assemble a rollout server: one gateway on the store, N in-process gateway nodes sharing it, the HTTP app.

All nodes send their sessions' calls to the one gateway, so the store has a single writer.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tracetap.rollout.node import GatewayNode, NodeConfig
from tracetap.rollout.server import BackgroundServer, create_app

from tracetap.launch import start_gateway

LOCAL = "local"


@dataclass(frozen=True)
class ServeConfig:
    store: Path
    upstream: str = LOCAL
    script: Path | None = None
    nodes: int = 1
    init_workers: int = 2
    run_workers: int = 2
    postrun_workers: int = 1
    gateway_args: tuple[str, ...] = ()  # more `tracetap gateway` flags (e.g. --max-model-len)

    def gateway_flags(self) -> list[str]:
        flags = [] if self.upstream == LOCAL else ["--upstream", self.upstream]
        flags += ["--script", str(self.script)] if self.script else []
        return [*flags, *self.gateway_args]


def node_factory(config: ServeConfig, gateway_url: str):
    """The nodes, made inside the server's event loop."""
    def make() -> list[GatewayNode]:
        return [GatewayNode(NodeConfig(store=config.store, gateway_url=gateway_url, node_id=f"node-{n}",
                                       init_workers=config.init_workers, run_workers=config.run_workers,
                                       postrun_workers=config.postrun_workers))
                for n in range(config.nodes)]
    return make


@contextmanager
def rollout_server(config: ServeConfig, host: str = "127.0.0.1", port: int = 0) -> Iterator[BackgroundServer]:
    """The gateway child and the server on a thread; both stopped on exit (running tasks cancelled)."""
    with start_gateway(Path(config.store), *config.gateway_flags()) as gateway:
        server = BackgroundServer(create_app(Path(config.store), node_factory(config, gateway.url)), host, port)
        server.start()
        try:
            yield server
        finally:
            server.stop()
