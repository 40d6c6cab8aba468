"""The `podman` runtime: rootless podman through its Docker-compatible API, run by the docker runtime's code.

`scripts/podman.sh start` runs `podman system service` as an unprivileged user (`tracetap-rootless`) on a
private socket (`$TRACETAP_PODMAN_HOST`). Its containers live in that user's user namespace: uid 0 inside
is the user on the host, so no process of a session holds a host privilege. What differs from docker:
- network: a rootless engine cannot put host firewall rules in front of a bridge, so the `gateway` network
  is no network (`network_mode: none`, a loopback only). The node's link is a unix socket in a folder
  mounted read-only into every container, and the container's main process is `forward.py` (run by the
  image's python3), listening on the container's own 127.0.0.1:LINK_PORT and copying to that socket. A
  container reaches its gateway and nothing else: it has no interface but `lo`.
- the mount: the container's users are other host users, so what the host writes into the session
  directory is made writable for them, and the sessions root must be searchable by the podman user.
- images: the podman user has its own store; `images.daemon.copy_image` loads one from dockerd.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.models.containers import Container
from tracetap.rollout.runtimes import forward
from tracetap.rollout.runtimes.base import RuntimeUnavailable
from tracetap.rollout.runtimes.docker import ContainerRuntime
from tracetap.rollout.runtimes.docker_host import ContainerHost, container_url, gateway_endpoint
from tracetap.rollout.runtimes.forward import Endpoint, Forwarder

DEFAULT_URL = "unix:///run/tracetap-podman/podman.sock"  # where scripts/podman.sh starts the service
LINK_MOUNT = "/tracetap/link"
LINK_PORT = 4000  # on each container's own loopback
LINK_SOCKET = "gateway.sock"
LINK_WAIT_SECONDS = 10


def podman_url() -> str:
    return os.environ.get("TRACETAP_PODMAN_HOST") or DEFAULT_URL


def link_folder(node_id: str) -> Path:
    """Short (unix socket paths are limited to 108 bytes) and found again by a restarted node."""
    return Path(tempfile.gettempdir()) / f"tracetap-link-{hashlib.sha256(node_id.encode()).hexdigest()[:10]}"


@dataclass(frozen=True)
class SocketLink:
    folder: Path  # host folder holding the gateway socket and forward.py, mounted at LINK_MOUNT


class PodmanHost(ContainerHost[SocketLink]):
    """A node's podman containers: the engine clients, the unix-socket link, the sweep."""

    def __init__(self, node_id: str, base_url: str | None = None) -> None:
        self.base_url = base_url or podman_url()
        super().__init__(node_id, self.base_url)
        self.service_uid = _socket_owner(self.base_url)

    @functools.cached_property
    def cgroup_version(self) -> str:
        """The engine's cgroup version ("1" or "2"), asked once from a worker thread (container options need it)."""
        return str(self.client.info().get("CgroupVersion", ""))

    async def sweep(self) -> int:
        """Remove this node id's containers and link folder (a crashed predecessor's)."""
        removed = await self.remove_containers()
        shutil.rmtree(link_folder(self.node_id), ignore_errors=True)
        return removed

    async def _open_link(self, gateway_url: str) -> tuple[SocketLink, str]:
        target, folder = gateway_endpoint(gateway_url), link_folder(self.node_id)
        shutil.rmtree(folder, ignore_errors=True)
        try:
            folder.mkdir(mode=0o755)
        except FileExistsError:
            raise RuntimeUnavailable(f"{folder} exists and cannot be removed: the podman link needs it") from None
        folder.chmod(0o755)
        shutil.copyfile(forward.__file__, folder / "forward.py")
        forwarder = Forwarder(Endpoint(path=str(folder / LINK_SOCKET)), target)
        await forwarder.start()
        (folder / LINK_SOCKET).chmod(0o666)  # the containers' users are other host users
        self._forwarder = forwarder
        return SocketLink(folder), container_url(gateway_url, "127.0.0.1", LINK_PORT)


def _socket_owner(base_url: str) -> int | None:
    """The uid the service runs as (its socket's owner); None when it is not a local unix socket."""
    path = base_url.removeprefix("unix://")
    return os.stat(path).st_uid if base_url.startswith("unix://") and os.path.exists(path) else None


class PodmanRuntime(ContainerRuntime[SocketLink]):
    """Implements `runtimes.base.Runtime`; `network` is the node's SocketLink, or None for the host's network."""

    host: PodmanHost

    def _create(self) -> Container:
        try:
            return super()._create()
        except docker.errors.APIError as exc:
            if "permission denied" not in str(exc.explanation):
                raise
            raise RuntimeUnavailable(f"the podman user cannot reach {self.session_dir}: every folder above it "
                                     f"must be searchable by that user (o+x): {exc.explanation}") from None

    def _options(self) -> dict:
        if (self.spec.cpus or self.spec.memory_mb) and self.host.cgroup_version == "1":
            raise RuntimeUnavailable("rootless podman on cgroup v1 cannot enforce runtime.cpus or memory_mb (it "
                                     "would ignore them): leave them out, or use the docker backend")
        options = super()._options()
        if self.network is not None:
            options["volumes"][str(self.network.folder)] = {"bind": LINK_MOUNT, "mode": "ro"}
        return options

    def _network_options(self) -> dict:
        return {"network_mode": "host" if self.network is None else "none"}

    def _command(self) -> list[str]:
        if self.network is None:
            return super()._command()
        return ["python3", f"{LINK_MOUNT}/forward.py", f"127.0.0.1:{LINK_PORT}", f"{LINK_MOUNT}/{LINK_SOCKET}"]

    async def _connect(self, container: Container) -> None:
        """Wait until the container's end of the link listens (it is the container's main process)."""
        if self.network is None:
            return
        probe = (f"for _ in $(seq {LINK_WAIT_SECONDS * 20}); do (exec 3<>/dev/tcp/127.0.0.1/{LINK_PORT}) "
                 "2>/dev/null && exit 0; sleep 0.05; done; exit 1")
        try:
            done = await self.host.call(container.exec_run, ["bash", "-c", probe], user=self.spec.user or "")
        except docker.errors.APIError:
            done = None
        if done is None or done.exit_code != 0:
            logs = await self.host.call(container.logs)
            raise RuntimeUnavailable(f"the gateway link did not start in {self.spec.image} (it needs python3): "
                                     f"{logs.decode(errors='replace')[-500:]}")

    def _foreign_user(self) -> bool:
        return super()._foreign_user() or self.host.service_uid != os.getuid()

