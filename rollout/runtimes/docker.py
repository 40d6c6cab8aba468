"""The `docker` runtime: one container per session from `runtime.image`, the session directory bind-mounted.

The host's `<sessions_root>/<session_id>/` is mounted at `/tracetap/session` (home/, workspace/,
artifacts/, logs/, logs/agent/), so logs land on the host and the evaluator scores the workspace there.
The container runs `sleep infinity` under Docker's init; each command is a `docker exec` of a small
wrapper that records its pid (an exec is a session leader, so the pid is its process group) in the
mount and redirects the command's output to its log files. A timeout or a cancellation kills that group
through another exec (TERM, then KILL after a grace). Teardown removes the container. All of that is
`ContainerRuntime`, which the podman runtime shares; `DockerRuntime` adds how a container joins the node's
network.
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import tarfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Generic

import docker
from docker.models.containers import Container
from tracetap.rollout.models import RuntimeSpec
from tracetap.rollout.runtimes.base import ExecResult, RuntimeUnavailable, SessionLayout
from tracetap.rollout.runtimes.docker_host import ContainerHost, L
from tracetap.rollout.runtimes.docker_network import NO_IPV6, NodeNetwork, confine
from tracetap.rollout.runtimes.local import KILL_GRACE_SECONDS, TIMED_OUT, RuntimeClosed, _copy, login_command
from tracetap.store import validate_session_id

MOUNT = "/tracetap/session"
RUN_DIR = ".tracetap"  # pid files of running commands, inside the session directory
WRAPPER = 'echo $$ >"$1"; exec bash -lc "$2" </dev/null >"$3" 2>"$4"'
PID_WAIT_SECONDS = 2.0
KILL_WAIT_SECONDS = 5.0
POLL_SECONDS = 0.05


def container_layout() -> SessionLayout:
    return SessionLayout(root=MOUNT, home=f"{MOUNT}/home", workspace=f"{MOUNT}/workspace",
                         artifacts=f"{MOUNT}/artifacts", logs=f"{MOUNT}/logs", agent_logs=f"{MOUNT}/logs/agent")


def container_name(session_id: str) -> str:
    """`tracetap-<session id>`: session ids are validated, and Docker's name rule admits them."""
    return f"tracetap-{validate_session_id(session_id)}"


class ContainerRuntime(ABC, Generic[L]):
    """Implements `runtimes.base.Runtime` in a container of `host`'s engine; `network` is the node's link (of
    type L), None for the host's network. Subclasses say how a container is put on the link."""

    def __init__(self, host: ContainerHost[L], sessions_root: Path | str, session_id: str, spec: RuntimeSpec,
                 labels: Mapping[str, str], network: L | None, kill_grace: float = KILL_GRACE_SECONDS):
        self.host, self.spec, self.labels, self.network = host, spec, dict(labels), network
        self.name = container_name(session_id)
        self.session_dir = Path(sessions_root).resolve() / validate_session_id(session_id)
        self.layout = container_layout()
        self.workdir = spec.workdir or self.layout.workspace
        self.kill_grace = kill_grace
        self.container: Container | None = None
        self.closed = False
        self._commands = 0

    # -- start ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.container is not None:
            return
        if self.closed:
            raise RuntimeClosed(f"the runtime of {self.session_dir.name} is torn down")
        for folder in (self.layout.home, self.layout.workspace, self.layout.artifacts, self.layout.agent_logs,
                       f"{MOUNT}/{RUN_DIR}"):
            self._host(folder).mkdir(parents=True, exist_ok=True)
        self._share(self.session_dir)
        creating = asyncio.ensure_future(self.host.call(self._create))
        try:
            self.container = container = await asyncio.shield(creating)
        except asyncio.CancelledError:  # the engine makes it anyway: keep it so teardown removes it
            self.container = await creating
            raise
        await self.host.call(container.start)
        await self._connect(container)

    @abstractmethod
    async def _connect(self, container: Container) -> None:
        """Put the started container on the node's link (nothing to do on the host network)."""

    def _command(self) -> list[str]:
        """The container's main process: it only keeps the container up."""
        return ["sleep", "infinity"]

    def _create(self) -> Container:
        try:
            return self.host.client.containers.create(self.spec.image, self._command(), **self._options())
        except docker.errors.ImageNotFound:
            raise RuntimeUnavailable(f"image {self.spec.image!r} is not in this node's Docker engine; build it "
                                     "first (`tracetap image build` prints the tag)") from None

    def _options(self) -> dict:
        spec = self.spec
        options = {"name": self.name, "labels": self.labels, "init": True, "working_dir": self.workdir,
                   "volumes": {str(self.session_dir): {"bind": MOUNT, "mode": "rw"}}, "user": spec.user or ""}
        options.update(self._network_options())
        if spec.cpus:
            options["nano_cpus"] = int(spec.cpus * 1e9)
        if spec.memory_mb:
            options["mem_limit"] = f"{spec.memory_mb}m"
        return options

    @abstractmethod
    def _network_options(self) -> dict:
        """The container's network options: the host's network, or what puts it on the link."""

    def _foreign_user(self) -> bool:
        """Whether the container's processes run as a host user other than the one that writes the mount."""
        return bool(self.spec.user) and self.spec.user not in ("0", "root")

    def _share(self, path: Path) -> None:
        """A foreign container user gets write access to what the host wrote into the mount."""
        if not self._foreign_user():
            return
        for item in [path, *path.rglob("*")] if path.is_dir() else [path]:
            item.chmod(item.stat().st_mode | 0o777 if item.is_dir() else item.stat().st_mode | 0o666)

    # -- paths ---------------------------------------------------------------------------------------

    def _absolute(self, target: str, base: str | None = None) -> str:
        return posixpath.normpath(posixpath.join(base or self.layout.workspace, target))

    def _host(self, path: str) -> Path:
        """The host path of a container path inside the mount."""
        relative = posixpath.relpath(path, MOUNT)
        if relative == ".." or relative.startswith("../"):
            raise ValueError(f"{path!r} is outside the session directory {MOUNT}")
        return self.session_dir / relative

    def _in_mount(self, path: str) -> bool:
        return path == MOUNT or path.startswith(MOUNT + "/")

    # -- exec ----------------------------------------------------------------------------------------

    def _running(self) -> Container:
        """The container; RuntimeClosed before `start` made it or once torn down."""
        if self.closed or self.container is None:
            raise RuntimeClosed(f"the runtime of {self.session_dir.name} is not running")
        return self.container

    async def exec(self, command: str, *, env: Mapping[str, str], log_name: str, cwd: str | None = None,
                   timeout: float | None = None) -> ExecResult:
        container = self._running()
        logs = self._absolute(log_name, self.layout.logs)
        self._host(logs).parent.mkdir(parents=True, exist_ok=True)
        out, err = f"{logs}.stdout.log", f"{logs}.stderr.log"
        self._commands += 1
        pidfile = f"{MOUNT}/{RUN_DIR}/{self._commands}.pid"
        started = time.monotonic()
        waiting = await self._launch(container, login_command(command, env.get("PATH")), env, cwd,
                                     [pidfile, out, err])
        returncode = await self._wait(container, waiting, pidfile, timeout)
        return ExecResult(returncode, self._host(out), self._host(err), time.monotonic() - started)

    async def _launch(self, container: Container, command: str, env: Mapping[str, str], cwd: str | None,
                      files: list[str]) -> asyncio.Future[int]:
        pidfile, out, err = files
        argv = ["bash", "-c", WRAPPER, "tracetap-exec", pidfile, command, out, err]
        created = await self.host.call(self.host.client.api.exec_create, container.id, argv,
                                       environment=dict(env), workdir=self._absolute(cwd or self.workdir),
                                       user=self.spec.user or "")
        exec_id = created["Id"]
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self.host.pool, self._run_to_end, exec_id)

    def _run_to_end(self, exec_id: str) -> int:
        self.host.waiter.api.exec_start(exec_id)
        return self.host.client.api.exec_inspect(exec_id)["ExitCode"]

    async def _wait(self, container: Container, waiting: asyncio.Future[int], pidfile: str,
                    timeout: float | None) -> int:
        try:
            done, _ = await asyncio.wait({waiting}, timeout=timeout)
        except asyncio.CancelledError:
            await asyncio.shield(self._end(container, waiting, pidfile))
            raise
        if done:
            return waiting.result()
        await self._end(container, waiting, pidfile)
        return TIMED_OUT

    async def _end(self, container: Container, waiting: asyncio.Future[int], pidfile: str) -> None:
        """TERM the command's group, KILL it after the grace; bounded even if the engine stops answering."""
        pgid = await self._pgid(pidfile)
        for signal, seconds in (("TERM", self.kill_grace), ("KILL", KILL_WAIT_SECONDS)):
            if pgid is None or waiting.done():
                break
            await self._signal(container, pgid, signal)
            await asyncio.wait({waiting}, timeout=seconds)

    async def _pgid(self, pidfile: str) -> int | None:
        path, deadline = self._host(pidfile), time.monotonic() + PID_WAIT_SECONDS
        while time.monotonic() < deadline:
            text = path.read_text().strip() if path.exists() else ""
            if text.isdigit():
                return int(text)
            await asyncio.sleep(POLL_SECONDS)
        return None

    async def _signal(self, container: Container, pgid: int, signal: str) -> None:
        try:
            await self.host.call(container.exec_run, ["bash", "-c", f"kill -s {signal} -- -{pgid}"],
                                 user=self.spec.user or "")  # bash's kill: images need not ship procps
        except docker.errors.APIError:  # the container is already gone
            pass

    # -- files ---------------------------------------------------------------------------------------

    async def upload(self, source: Path, target: str) -> None:
        self._running()
        source, path = Path(source), self._absolute(target)
        if not source.exists():
            raise FileNotFoundError(f"upload source {source} does not exist")
        if self._in_mount(path):
            await asyncio.to_thread(_copy, source, self._host(path))
            self._share(self._host(path))
            return
        await self._put(path, lambda tar: tar.add(source, arcname=posixpath.basename(path)))

    async def write_text(self, target: str, text: str) -> None:
        path = self._absolute(target)
        if self._in_mount(path):
            destination = self._host(path)
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_text(text)
            self._share(destination)
            return
        data = text.encode()
        info = tarfile.TarInfo(posixpath.basename(path))
        info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
        await self._put(path, lambda tar: tar.addfile(info, io.BytesIO(data)))

    async def read_text(self, target: str) -> str:
        path = self._absolute(target)
        if self._in_mount(path):
            return await asyncio.to_thread(self._host(path).read_text, errors="replace")
        try:
            archive = await self.host.call(_fetch, self._running(), path)
        except docker.errors.NotFound:
            raise FileNotFoundError(f"{path} does not exist in the container") from None
        return _only_file(archive, path).decode(errors="replace")

    async def _put(self, path: str, fill: Callable[[tarfile.TarFile], None]) -> None:
        """Copy into the container outside the mount: a tar unpacked into the target's parent folder."""
        container = self._running()
        parent = posixpath.dirname(path)
        if parent == path:
            raise ValueError(f"cannot upload to {path!r}")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            await asyncio.to_thread(fill, tar)
        made = await self.host.call(container.exec_run, ["mkdir", "-p", parent], user=self.spec.user or "")
        if made.exit_code != 0:
            raise OSError(f"could not create {parent} in the container: {made.output.decode(errors='replace')}")
        await self.host.call(container.put_archive, parent, buffer.getvalue())

    # -- the end -------------------------------------------------------------------------------------

    async def teardown(self) -> None:
        self.closed = True
        container, self.container = self.container, None
        if container is None:
            return
        try:
            await self.host.call(container.remove, force=True)
        except docker.errors.NotFound:
            pass


class DockerRuntime(ContainerRuntime[NodeNetwork]):
    """A docker container, on the node's internal network (rollout/runtimes/docker_network.py) or the host's."""

    async def _connect(self, container: Container) -> None:
        """Cut the started container's routes down to the gateway link (nothing to do on the host network)."""
        if self.network is not None:
            await self.host.call(container.reload)
            await confine(container.attrs["State"]["Pid"], self.network.gateway_ip)

    def _network_options(self) -> dict:
        if self.network is None:
            return {"network_mode": "host"}
        return {"network": self.network.name, "sysctls": NO_IPV6}


def _fetch(container: Container, path: str) -> bytes:
    chunks, _ = container.get_archive(path)
    return b"".join(chunks)


def _only_file(archive: bytes, path: str) -> bytes:
    """The content of the one regular file a `get_archive` tar holds."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.next()
        if member is None or not member.isfile():
            raise IsADirectoryError(f"{path} is not a regular file in the container")
        content = tar.extractfile(member)
        assert content is not None  # a regular file always has content
        return content.read()
