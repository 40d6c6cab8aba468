"""Assemble a rollout server: one gateway on the store, N gateway nodes sharing it, the HTTP app.

The nodes live in the server's process, or with `ray` set each is a Ray actor (ray_nodes.py) on a
private local cluster (`local`) or an existing one. All nodes send their sessions' calls to the one
gateway, so the store has a single writer; it listens on 127.0.0.1, so actors must run on this machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from tracetap.rollout.node import GatewayNode, NodeConfig
from tracetap.rollout.node_api import Node
from tracetap.rollout.server import BackgroundServer, create_app

from tracetap.launch import start_gateway

LOCAL = "local"
STARTUP_SECONDS = 240.0  # the server's startup makes the nodes: Ray actors start their worker processes then


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
    ray: str | None = None  # a Ray address (or `local`): each node a Ray actor
    gateway_mode: str = "reverse"  # `proxy`: tasks may also use agent.capture 'proxy'

    def gateway_flags(self) -> list[str]:
        flags = [] if self.upstream == LOCAL else ["--upstream", self.upstream]
        flags += ["--script", str(self.script)] if self.script else []
        flags += ["--mode", "proxy"] if self.gateway_mode == "proxy" else []
        flags += ["--sessions", "keyed"]  # harnesses call with their session key (capture/sessions.py)
        return [*flags, *self.gateway_args]


def node_configs(config: ServeConfig, gateway_url: str) -> list[NodeConfig]:
    return [NodeConfig(store=config.store, gateway_url=gateway_url, node_id=f"node-{n}",
                       init_workers=config.init_workers, run_workers=config.run_workers,
                       postrun_workers=config.postrun_workers, gateway_proxies=config.gateway_mode == "proxy")
            for n in range(config.nodes)]


def node_factory(config: ServeConfig, gateway_url: str):
    """The nodes, made inside the server's event loop: in-process, or one Ray actor each (spread over
    the cluster's machines, one CPU each)."""
    def make() -> list[Node]:
        return [GatewayNode(node) for node in node_configs(config, gateway_url)]

    def make_actors() -> list[Node]:
        from tracetap.rollout.ray_nodes import RayNode

        return [RayNode(node, num_cpus=1, scheduling_strategy="SPREAD") for node in node_configs(config, gateway_url)]
    return make if config.ray is None else make_actors


@contextmanager
def rollout_server(config: ServeConfig, host: str = "127.0.0.1", port: int = 0) -> Iterator[BackgroundServer]:
    """The gateway child (and the Ray connection) and the server on a thread; all stopped on exit
    (running tasks cancelled)."""
    with ExitStack() as stack:
        if config.ray is not None:
            from tracetap.rollout.ray_nodes import ray_cluster

            stack.enter_context(ray_cluster(config.ray, config.nodes))
        gateway = stack.enter_context(start_gateway(Path(config.store), *config.gateway_flags()))
        server = BackgroundServer(create_app(Path(config.store), node_factory(config, gateway.url)), host, port)
        server.start(STARTUP_SECONDS)
        stack.callback(server.stop)
        yield server
