"""Runtimes by `RuntimeSpec.backend` name: a node's `NodeRuntimes` creates each session's.

`local` needs nothing shared. `docker` sessions of one node share a `DockerHost` (made on first use):
the engine clients, the node's container network and the link through which containers reach the
node's gateway; `podman` sessions share a `PodmanHost` the same way (rootless podman's Docker-compatible
API). The SDK is imported only then, so a node without the `containers` extra runs local sessions as before.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracetap.rollout.models import RuntimeSpec
from tracetap.rollout.runtimes.base import Runtime, RuntimeUnavailable
from tracetap.rollout.runtimes.local import LocalRuntime

if TYPE_CHECKING:
    from tracetap.rollout.runtimes.docker_host import ContainerHost

__all__ = ["NodeRuntimes", "Runtime", "RuntimeUnavailable", "create_runtime"]
logger = logging.getLogger("tracetap.rollout.runtimes")


def create_runtime(spec: RuntimeSpec, sessions_root: Path | str, session_id: str) -> Runtime:
    """A runtime that needs no node: `local` only (containers come from a node's `NodeRuntimes`)."""
    if spec.backend == "local":
        return LocalRuntime(sessions_root, session_id, spec)
    raise RuntimeUnavailable(f"runtime backend {spec.backend!r} needs a gateway node (NodeRuntimes)")


CONTAINER_BACKENDS = ("docker", "podman")


def _engine_missing(backend: str) -> str | None:
    """Why this process cannot drive the backend's engine, or None."""
    try:
        from tracetap.rollout.runtimes.docker_host import engine_available
        from tracetap.rollout.runtimes.podman import podman_url
    except ImportError:
        return "the docker SDK is not installed (pip install 'tracetap[containers]')"
    if backend == "podman":
        reason = engine_available(podman_url())
        return reason and f"{reason} (start rootless podman with scripts/podman.sh start)"
    return engine_available()


class NodeRuntimes:
    """One node's runtimes. `start` sweeps what a crashed predecessor with the same node id left."""

    def __init__(self, node_id: str, sessions_root: Path) -> None:
        self.node_id, self.sessions_root = node_id, Path(sessions_root)
        self.gateway_url: str | None = None
        self._hosts: dict[str, ContainerHost[Any]] = {}  # backend -> DockerHost / PodmanHost, made on first use

    async def start(self, gateway_url: str) -> None:
        self.gateway_url = gateway_url
        for backend in CONTAINER_BACKENDS:
            if _engine_missing(backend) is None:
                swept = await self._host(backend).sweep()
                if swept:
                    logger.warning("node %s: removed %d %s containers left by an earlier run", self.node_id, swept,
                                   backend)

    def _host(self, backend: str) -> ContainerHost[Any]:
        from tracetap.rollout.runtimes.docker_host import DockerHost
        from tracetap.rollout.runtimes.podman import PodmanHost

        if backend not in self._hosts:
            self._hosts[backend] = (PodmanHost if backend == "podman" else DockerHost)(self.node_id)
        return self._hosts[backend]

    async def create(self, spec: RuntimeSpec, session_id: str, task_id: str) -> tuple[Runtime, str]:
        """The session's runtime (not started) and the gateway URL as its processes reach it."""
        if self.gateway_url is None:
            raise RuntimeUnavailable(f"node {self.node_id}: its runtimes are not started yet")
        if spec.backend == "local":
            return LocalRuntime(self.sessions_root, session_id, spec), self.gateway_url
        if spec.backend not in CONTAINER_BACKENDS:
            raise RuntimeUnavailable(f"runtime backend {spec.backend!r} is not available on this node")
        # once the node holds the engine's clients, an engine that stopped answering fails the calls themselves
        if spec.backend not in self._hosts and (reason := _engine_missing(spec.backend)) is not None:
            raise RuntimeUnavailable(f"runtime backend {spec.backend!r}: {reason}")
        return await self._container(spec, session_id, task_id, self.gateway_url)

    async def _container(self, spec: RuntimeSpec, session_id: str, task_id: str,
                         gateway_url: str) -> tuple[Runtime, str]:
        from tracetap.rollout.runtimes.docker import DockerRuntime
        from tracetap.rollout.runtimes.podman import PodmanRuntime

        host = self._host(spec.backend)
        network, url = (None, gateway_url) if spec.network == "host" else await host.link(gateway_url)
        labels = {"tracetap.node": self.node_id, "tracetap.session": session_id, "tracetap.task": task_id}
        runtime = PodmanRuntime if spec.backend == "podman" else DockerRuntime
        return runtime(host, self.sessions_root, session_id, spec, labels, network), url

    async def close(self) -> None:
        hosts, self._hosts = list(self._hosts.values()), {}
        for host in hosts:
            await host.close()
