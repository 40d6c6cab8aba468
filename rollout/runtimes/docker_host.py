"""What one node's containers share: the Docker engine clients, the network with its gateway link, the sweep.

The SDK blocks, so every call runs on this host's own thread pool (a long exec wait must not starve the
event loop's default executor, which POSTRUN's store work uses). Exec waits use a client without a read
timeout: a command that prints nothing for a minute is still running, and its bound is the runtime's
own timeout, which kills it. Everything the node created carries the label `tracetap.node=<node id>`.
"""

from __future__ import annotations

import asyncio
import functools
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar
from urllib.parse import urlsplit, urlunsplit

import docker
from tracetap.rollout.runtimes import docker_network
from tracetap.rollout.runtimes.base import RuntimeUnavailable
from tracetap.rollout.runtimes.docker_network import LABEL_NODE, NodeNetwork
from tracetap.rollout.runtimes.forward import Endpoint, Forwarder

CONTROL_TIMEOUT = 60
PING_TIMEOUT = 5
POOL_THREADS = 64
T = TypeVar("T")
L = TypeVar("L")  # how a host's containers reach the node's gateway: NodeNetwork (docker), SocketLink (podman)


def engine_client(timeout: int | None = CONTROL_TIMEOUT, base_url: str | None = None) -> docker.DockerClient:
    """A client for `base_url`, else `$DOCKER_HOST` (else Docker's default socket)."""
    if base_url:
        return docker.DockerClient(base_url=base_url, timeout=timeout)
    return docker.from_env(timeout=timeout)


def engine_available(base_url: str | None = None) -> str | None:
    """None when the engine answers, else why not (a message for the user)."""
    where = base_url or f"DOCKER_HOST={os.environ.get('DOCKER_HOST', 'unset')}"
    try:
        client = engine_client(PING_TIMEOUT, base_url)
        client.ping()
        client.close()
    except docker.errors.DockerException as exc:
        return f"no Docker API answers ({where}): {exc}"
    return None


def container_url(gateway_url: str, host: str, port: int) -> str:
    """The node's gateway URL with its address swapped for the link's (path kept)."""
    parts = urlsplit(gateway_url)
    return urlunsplit((parts.scheme, f"{host}:{port}", parts.path, "", ""))


def gateway_endpoint(gateway_url: str) -> Endpoint:
    """The `host:port` of the gateway, where the link forwards to."""
    parts = urlsplit(gateway_url)
    if parts.hostname is None or parts.port is None:
        raise RuntimeUnavailable(f"the gateway URL {gateway_url!r} names no host and port for the containers' link")
    return Endpoint(parts.hostname, parts.port)


class ContainerHost(ABC, Generic[L]):
    """One engine's share of a node: its clients, their thread pool, the link (of type L) to the gateway."""

    def __init__(self, node_id: str, base_url: str | None = None) -> None:
        self.node_id = node_id
        self.client = engine_client(base_url=base_url)
        self.waiter = engine_client(timeout=None, base_url=base_url)
        self.pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix=f"docker-{node_id}")
        self._link: tuple[L, str] | None = None  # the link and the gateway URL through it, made on first use
        self._forwarder: Forwarder | None = None
        self._lock = asyncio.Lock()

    async def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    @abstractmethod
    async def sweep(self) -> int:
        """Remove what this node id left on the engine (a crashed predecessor's); the containers removed."""

    async def remove_containers(self) -> int:
        leftovers = await self.call(self.client.containers.list, all=True,
                                    filters={"label": f"{LABEL_NODE}={self.node_id}"})
        await asyncio.gather(*(self.call(container.remove, force=True) for container in leftovers))
        return len(leftovers)

    async def link(self, gateway_url: str) -> tuple[L, str]:
        """The node's link and the gateway URL as its containers see it (made on first use)."""
        async with self._lock:
            if self._link is None:
                self._link = await self._open_link(gateway_url)
            return self._link

    @abstractmethod
    async def _open_link(self, gateway_url: str) -> tuple[L, str]:
        """Make the link (keeping its forwarder in `_forwarder`): the link, and the gateway URL through it."""

    async def close(self) -> None:
        """Stop the link and remove whatever of this node is left (containers first: they use the network)."""
        if self._forwarder is not None:
            await self._forwarder.close()
        await self.sweep()
        self._link = self._forwarder = None
        self.client.close()
        self.waiter.close()
        self.pool.shutdown(wait=False, cancel_futures=True)


class DockerHost(ContainerHost[NodeNetwork]):
    """A node's docker containers: their link is the node's internal network (rollout/runtimes/docker_network.py)."""

    async def sweep(self) -> int:
        """Remove this node id's containers, networks and firewall rules (a crashed predecessor's)."""
        removed = await self.remove_containers()
        await self.call(docker_network.remove_networks, self.client, self.node_id)
        await docker_network.remove_rules(docker_network.bridge_name(self.node_id))
        return removed

    async def _open_link(self, gateway_url: str) -> tuple[NodeNetwork, str]:
        target = gateway_endpoint(gateway_url)
        try:
            network = await self.call(docker_network.create_network, self.client, self.node_id)
        except docker.errors.APIError as exc:
            raise RuntimeUnavailable(f"could not create the container network: {exc.explanation}") from None
        forwarder = Forwarder(Endpoint(network.gateway_ip), target)
        port = await forwarder.start()
        await docker_network.allow_only(network, port)
        self._forwarder = forwarder
        return network, container_url(gateway_url, network.gateway_ip, port)
