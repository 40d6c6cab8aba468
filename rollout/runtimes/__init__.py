"""Runtimes by `RuntimeSpec.backend` name: a node's `NodeRuntimes` creates each session's.

`local` needs nothing shared. `docker` sessions of one node share a `DockerHost` (made on first use):
the engine clients, the node's container network and the link through which containers reach the
node's gateway. The SDK is imported only then, so a node without the `containers` extra runs local
sessions as before.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tracetap.rollout.models import RuntimeSpec
from tracetap.rollout.runtimes.base import Runtime, RuntimeUnavailable
from tracetap.rollout.runtimes.local import LocalRuntime

__all__ = ["NodeRuntimes", "Runtime", "RuntimeUnavailable", "create_runtime"]
logger = logging.getLogger("tracetap.rollout.runtimes")


def create_runtime(spec: RuntimeSpec, sessions_root: Path | str, session_id: str) -> Runtime:
    """A runtime that needs no node: `local` only (containers come from a node's `NodeRuntimes`)."""
    if spec.backend == "local":
        return LocalRuntime(sessions_root, session_id, spec)
    raise RuntimeUnavailable(f"runtime backend {spec.backend!r} needs a gateway node (NodeRuntimes)")


def _docker_missing() -> str | None:
    """Why this process cannot drive Docker, or None."""
    try:
        from tracetap.rollout.runtimes.docker_host import engine_available
    except ImportError:
        return "the docker SDK is not installed (pip install 'tracetap[containers]')"
    return engine_available()


class NodeRuntimes:
    """One node's runtimes. `start` sweeps what a crashed predecessor with the same node id left."""

    def __init__(self, node_id: str, sessions_root: Path) -> None:
        self.node_id, self.sessions_root = node_id, Path(sessions_root)
        self.gateway_url: str | None = None
        self._docker = None  # DockerHost, made on first use

    async def start(self, gateway_url: str) -> None:
        self.gateway_url = gateway_url
        if _docker_missing() is None:
            swept = await self._docker_host().sweep()
            if swept:
                logger.warning("node %s: removed %d containers left by an earlier run", self.node_id, swept)

    def _docker_host(self):
        from tracetap.rollout.runtimes.docker_host import DockerHost

        if self._docker is None:
            self._docker = DockerHost(self.node_id)
        return self._docker

    async def create(self, spec: RuntimeSpec, session_id: str, task_id: str) -> tuple[Runtime, str]:
        """The session's runtime (not started) and the gateway URL as its processes reach it."""
        if spec.backend == "local":
            return LocalRuntime(self.sessions_root, session_id, spec), self.gateway_url
        if spec.backend != "docker":
            raise RuntimeUnavailable(f"runtime backend {spec.backend!r} is not available on this node")
        if (reason := _docker_missing()) is not None:
            raise RuntimeUnavailable(f"runtime backend 'docker': {reason}")
        return await self._container(spec, session_id, task_id)

    async def _container(self, spec: RuntimeSpec, session_id: str, task_id: str) -> tuple[Runtime, str]:
        from tracetap.rollout.runtimes.docker import DockerRuntime

        host = self._docker_host()
        network, url = (None, self.gateway_url) if spec.network == "host" else await host.link(self.gateway_url)
        labels = {"tracetap.node": self.node_id, "tracetap.session": session_id, "tracetap.task": task_id}
        return DockerRuntime(host, self.sessions_root, session_id, spec, labels, network), url

    async def close(self) -> None:
        if self._docker is not None:
            await self._docker.close()
            self._docker = None
