"""Gateway nodes as Ray actors: `NodeActor` (a GatewayNode in its own process) and `RayNode`, its proxy.

The server talks to a `RayNode` exactly as to an in-process GatewayNode (`node_api.Node`); the proxy
awaits the actor's ObjectRefs. A session goes to the actor in two calls, `admit` (returns once INIT
has begun) then `result`, so a lost actor tells the two cases apart: lost before INIT began, the
session is sent elsewhere (`SessionNotStarted`); lost after, it ends ERROR `node_lost`. The actor is
lost when Ray reports it dead on any await, or when it fails to answer a ping: no await outlives it.
Once lost, the proxy kills the actor (a hung one must not run on), ends the process groups its
unfinished sessions left on this machine (recorded in their session directories) and answers every
later call at once (`stats` raises NodeLost, so the pool drops it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayActorError
from tracetap.rollout.models import SessionContext, SessionResult, SessionStatus
from tracetap.rollout.node import GatewayNode, NodeConfig
from tracetap.rollout.node_api import GatewayAnswer, NodeLost, NodeStats, SessionNotStarted
from tracetap.rollout.runtimes.local import KILL_GRACE_SECONDS
from tracetap.rollout.runtimes.processes import GROUPS_FILE, POLL_SECONDS, end_recorded_groups, is_alive

logger = logging.getLogger("tracetap.rollout.ray_nodes")

LOCAL = "local"
START_SECONDS = 180.0   # a new actor's worker process starts and imports the node
ANSWER_SECONDS = 60.0   # stats, statuses, cancel, shutdown: quick calls, generous on a loaded machine
PING_SECONDS = 30.0     # an actor that does not answer a ping within this is lost
WATCH_SECONDS = 5.0     # how often a long wait pings its actor
RESULT_SLACK_SECONDS = 120.0  # past budget + POSTRUN grace, a result that has not come is not coming
OBJECT_STORE_BYTES = 128 * 1024 * 1024  # the nodes pass small messages only
PROBE_SECONDS = 5.0     # a cluster address must accept a TCP connection within this
CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's single-machine mode (see _loopback_only)
P = ParamSpec("P")
R = TypeVar("R")


class RayUnavailable(RuntimeError):
    """No Ray cluster could be reached at the address given."""


class NodeActor(GatewayNode):
    """The GatewayNode, plus the two-phase entry the proxy needs; run as a Ray actor by `RayNode`."""

    def __init__(self, config: NodeConfig) -> None:
        super().__init__(config)
        self._pending: dict[str, asyncio.Future] = {}

    async def admit(self, session: SessionContext) -> bool:
        """Queue the session; return once its INIT has begun (True) or it ended before that (False)."""
        run = await self._queue(session)
        self._pending[run.session_id] = run.done
        began = asyncio.ensure_future(run.began.wait())
        await asyncio.wait([began, run.done], return_when=asyncio.FIRST_COMPLETED)
        began.cancel()
        return run.began.is_set()

    async def result(self, session_id: str) -> SessionResult:
        """The result of an admitted session, once it has ended."""
        return await asyncio.shield(self._pending.pop(session_id))

    async def where(self) -> tuple[str, int]:
        """The machine and process the node runs in (logged by the server; answers the liveness ping)."""
        return socket.gethostname(), os.getpid()


RemoteNodeActor = ray.remote(NodeActor)


def send(actor: ActorHandle[NodeActor], method: Callable[Concatenate[NodeActor, P], Awaitable[R]], *args: P.args,
         **kwargs: P.kwargs) -> ray.ObjectRef[R]:
    """`actor.<method>.remote(*args)`: an ObjectRef of the method's result, typed from NodeActor's own method
    (Ray types `actor.<method>` as the class's coroutine function)."""
    return getattr(actor, method.__name__).remote(*args, **kwargs)


class RayNode:
    """Implements `node_api.Node` for one `NodeActor`; every await on it is bounded by the actor's life."""

    def __init__(self, config: NodeConfig, **options: Any) -> None:
        """`options`: Ray actor options (resources, scheduling strategy)."""
        self.id = config.node_id or f"node-{secrets.token_hex(4)}"
        self.config = config
        self.sessions_root = config.sessions_root or config.store.parent / "sessions"
        # Ray types what `.remote()` returns as the handle or the class itself: it is always the handle
        self.actor = cast(ActorHandle[NodeActor], RemoteNodeActor.options(**options).remote(config))
        self.lost: str | None = None
        self.worker: tuple[str, int] | None = None  # the actor's machine and process, once it answered
        self._open: set[str] = set()  # sessions handed to the actor whose result has not come back
        self._reaping: asyncio.Future | None = None

    async def node_id(self) -> str:
        self.worker = host, pid = await self._call(send(self.actor, NodeActor.where), START_SECONDS)
        logger.info("node %s runs on %s, pid %d", self.id, host, pid)
        return self.id

    async def run_session(self, session: SessionContext) -> SessionResult:
        sid = session.session_id
        self._open.add(sid)
        try:
            try:
                await self._call(send(self.actor, NodeActor.admit, session))
            except NodeLost as exc:
                raise SessionNotStarted(str(exc)) from exc
            return await self._call(send(self.actor, NodeActor.result, sid), _result_bound(session, self.config))
        finally:
            self._open.discard(sid)

    async def cancel(self, session_id: str) -> bool:
        try:
            return self.lost is None and await self._call(send(self.actor, NodeActor.cancel, session_id),
                                                          ANSWER_SECONDS)
        except NodeLost:
            return False

    async def statuses(self) -> dict[str, SessionStatus]:
        try:
            return {} if self.lost else await self._call(send(self.actor, NodeActor.statuses), ANSWER_SECONDS)
        except NodeLost:
            return {}

    async def stats(self) -> NodeStats:
        return await self._call(send(self.actor, NodeActor.stats), ANSWER_SECONDS)

    async def gateway_admin(self, action: str, body: dict | None) -> GatewayAnswer:
        return await self._call(send(self.actor, NodeActor.gateway_admin, action, body), ANSWER_SECONDS)

    async def shutdown(self) -> None:
        """Shut the node down cleanly, then end its actor (its worker process)."""
        if self.lost is None:
            try:
                await self._call(send(self.actor, NodeActor.shutdown), ANSWER_SECONDS)
            except NodeLost:
                return
            self.lost = f"node {self.id} is shut down"
        ray.kill(self.actor)

    # -- awaiting the actor ------------------------------------------------------------------------

    async def _call(self, ref: ray.ObjectRef[R], timeout: float | None = None) -> R:
        """The call's answer; NodeLost when the actor died, stopped answering pings or took past `timeout`."""
        if self.lost is not None:
            raise NodeLost(self.lost)
        answer = asyncio.wrap_future(ref.future())
        try:
            return await self._watch(answer, timeout)
        except RayActorError as exc:
            raise await self._declare_lost(f"its actor died ({type(exc).__name__})") from exc
        finally:
            answer.cancel()

    async def _watch(self, answer: asyncio.Future[R], timeout: float | None) -> R:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            done, _ = await asyncio.wait([answer], timeout=WATCH_SECONDS)
            if done:
                return answer.result()
            if deadline is not None and loop.time() >= deadline:
                raise await self._declare_lost(f"no answer within {timeout:.0f} s")
            await self._ping()

    async def _ping(self) -> None:
        try:
            await asyncio.wait_for(asyncio.wrap_future(send(self.actor, NodeActor.where).future()), PING_SECONDS)
        except TimeoutError:
            raise await self._declare_lost(f"no answer to a ping within {PING_SECONDS:.0f} s") from None

    async def _declare_lost(self, reason: str) -> NodeLost:
        """Once: kill the actor and end the process groups of its unfinished sessions; every caller waits
        for that, so a session is reported lost only after its processes are gone."""
        if self._reaping is None:
            self.lost = f"node {self.id} lost: {reason}"
            logger.warning("%s; ending what its sessions left running", self.lost)
            ray.kill(self.actor, no_restart=True)
            self._reaping = asyncio.ensure_future(self._reap(sorted(self._open)))
        await asyncio.shield(self._reaping)
        return NodeLost(self.lost)

    async def _reap(self, session_ids: list[str]) -> None:
        await self._worker_gone()
        ended = await asyncio.gather(*(end_recorded_groups(self.sessions_root / sid / GROUPS_FILE, KILL_GRACE_SECONDS)
                                       for sid in session_ids))
        if sum(ended):
            logger.warning("node %s: ended %d process groups of its sessions", self.id, sum(ended))

    async def _worker_gone(self) -> None:
        """Wait (bounded) for a killed actor's process on this machine to exit: Ray reports an actor dead
        before its process is, and the process must not start a harness after the groups are ended."""
        if self.worker is None or self.worker[0] != socket.gethostname():
            return
        deadline = asyncio.get_running_loop().time() + PING_SECONDS
        while is_alive(self.worker[1]) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(POLL_SECONDS)
        if is_alive(self.worker[1]):
            logger.warning("node %s: its worker process %d is still alive", self.id, self.worker[1])


def _result_bound(session: SessionContext, config: NodeConfig) -> float:
    """How long a result may take once INIT has begun: the budget, POSTRUN's grace, and slack."""
    return session.task.timeout_seconds + config.postrun_grace + RESULT_SLACK_SECONDS


@contextmanager
def ray_cluster(address: str, cpus: int) -> Iterator[None]:
    """Connect to the Ray cluster at `address` (`auto`, `HOST:PORT`, `ray://...`), or for `local` start a
    private one on 127.0.0.1 with `cpus` CPUs; disconnect on exit, which also stops a cluster started here."""
    if address != LOCAL:
        _probe(address)
        try:
            ray.init(address=address)
        except ConnectionError as exc:  # `auto` with no cluster running here
            raise RayUnavailable(f"no Ray cluster at {address!r}: {exc}") from None
    else:
        with _loopback_only():
            ray.init(num_cpus=cpus, num_gpus=0, include_dashboard=False, _node_ip_address="127.0.0.1",
                     object_store_memory=OBJECT_STORE_BYTES)
    try:
        yield
    finally:
        ray.shutdown()


def _probe(address: str) -> None:
    """A `HOST:PORT` (or `ray://HOST:PORT`) where nothing answers fails here at once: `ray.init` would retry it
    for minutes. `auto` is first resolved as `ray.init` resolves it, so a cluster that stopped since it was
    recorded fails here too."""
    if address == "auto":
        address = _resolve_auto()
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_SECONDS).close()
    except OSError as exc:
        raise RayUnavailable(f"no Ray cluster answers at {address!r}: {exc}") from None


def _resolve_auto() -> str:
    """The `HOST:PORT` that `auto` names (RAY_ADDRESS, the cluster last started on this machine, a running GCS),
    through ray.init's own lookup (a private function: ray is pinned); `auto` itself when it names no address."""
    from ray._private.services import get_ray_address_from_environment

    try:
        return get_ray_address_from_environment("auto", None) or "auto"
    except ConnectionError as exc:
        raise RayUnavailable(f"no Ray cluster at 'auto': {exc}") from None


@contextmanager
def _loopback_only() -> Iterator[None]:
    """While a local cluster starts: every Ray server binds 127.0.0.1, and no token file goes to ~/.ray.

    Ray turns 127.0.0.1 into the machine's address (`services.resolve_ip_for_localhost`) and then listens
    on every interface, unless it runs in its single-machine mode (as on macOS): that is Ray's
    `ENABLE_RAY_CLUSTER` switch, read from this environment variable when `ray` is imported (hence the
    module attribute too). With only loopback reachable, token auth is left off."""
    from ray._private import ray_constants

    saved = {name: os.environ.get(name) for name in (CLUSTER_SWITCH, "RAY_AUTH_MODE")}
    os.environ[CLUSTER_SWITCH] = "0"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    switch, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = switch
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value
