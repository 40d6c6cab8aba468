"""GatewayNode: runs sessions through INIT -> READY -> RUNNING -> POSTRUN and hosts their gateway.

Each stage has its own pool of asyncio workers fed by a queue. READY is bounded by a semaphore of
`run_workers` slots: an INIT worker that finished preparing waits for a slot before taking the next
session, so preparation of the next sessions overlaps the current runs without piling up prepared
runtimes. One budget per session (`timeout_seconds`) runs from the start of INIT to the end of
POSTRUN; a harness out of budget still goes through POSTRUN (its calls are built: a partial
trajectory, status TIMEOUT), which gets at least `postrun_grace` seconds. POSTRUN closes the session in
the store (compaction), builds it, evaluates it (in its live runtime, and in a fresh one started during
RUN when the evaluator asks: rollout/eval_runtime.py), ends its processes and joins the reward into its
traces. A queued, ready or running session can be cancelled: torn down, CANCELLED.

Every public method is async, so the same class serves in-process and as a Ray actor.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from tracetap.rollout import eval_runtime, postrun
from tracetap.rollout.gateway_host import GatewayError, GatewayHost
from tracetap.rollout.harnesses import HARNESSES
from tracetap.rollout.harnesses.base import HarnessContext, Step, gateway_env
from tracetap.rollout.models import (
    EvaluatorSpec,
    PrepareAction,
    SessionContext,
    SessionResult,
    SessionStatus,
    TaskRequest,
)
from tracetap.rollout.node_api import GatewayAnswer, NodeStats
from tracetap.rollout.runtimes import NodeRuntimes, RuntimeUnavailable
from tracetap.rollout.runtimes.base import ExecResult, Runtime
from tracetap.rollout.session_run import SessionRun, Stage, StageFailure
from tracetap.store import validate_session_id

logger = logging.getLogger("tracetap.rollout.node")

POSTRUN_GRACE_SECONDS = 30.0
CANCELLABLE = (Stage.QUEUED, Stage.INIT, Stage.READY, Stage.RUN)
Worker = Callable[[SessionRun], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class NodeConfig:
    """`gateway_url` set: sessions call that gateway (it must write into `store`); otherwise the node
    starts `tracetap gateway --store STORE GATEWAY_ARGS...` (e.g. `--script FILE`, `--upstream URL`)."""

    store: Path
    sessions_root: Path | None = None  # default: a `sessions` folder beside the store
    node_id: str | None = None
    init_workers: int = 2
    run_workers: int = 2
    postrun_workers: int = 1
    gateway_url: str | None = None
    gateway_args: tuple[str, ...] = ()
    postrun_grace: float = POSTRUN_GRACE_SECONDS
    gateway_proxies: bool = False  # the gateway runs in proxy mode: tasks may use agent.capture 'proxy'

    def __post_init__(self) -> None:
        for name in ("init_workers", "run_workers", "postrun_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


class NodeClosed(RuntimeError):
    """A session sent to a node that has shut down."""


class GatewayNode:
    """Implements `node_api.Node`."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.id = config.node_id or f"node-{uuid.uuid4().hex[:8]}"
        self.store = Path(config.store)
        self.sessions_root = Path(config.sessions_root or self.store.parent / "sessions")
        proxying = ("--mode", "proxy") if config.gateway_proxies and config.gateway_url is None else ()
        self.gateway = GatewayHost(self.store, config.gateway_url, (*config.gateway_args, *proxying))
        self.runtimes = NodeRuntimes(self.id, self.sessions_root)
        self._live: dict[str, SessionRun] = {}
        self._seen: set[str] = set()  # session ids are single-use
        self._workers: list[asyncio.Task] = []
        self._start_lock = asyncio.Lock()
        self._closed = False

    # -- the Node protocol -------------------------------------------------------------------------

    async def node_id(self) -> str:
        return self.id

    async def gateway_admin(self, action: str, body: dict | None) -> GatewayAnswer:
        await self.start()
        return await self.gateway.admin(action, body)

    async def start(self) -> str:
        """Start the gateway (unless given one) and the stage workers; idempotent. Returns the gateway URL."""
        async with self._start_lock:
            if self._closed:
                raise NodeClosed(f"node {self.id} is shut down")
            if not self._workers:
                await self.runtimes.start(await self.gateway.start())
                self._start_pools()
        url = self.gateway.url
        assert url is not None  # the gateway started above, or on the call that started the workers
        return url

    async def run_session(self, session: SessionContext) -> SessionResult:
        """Queue the session and return its result once it has ended. Cancelling this await does not end
        the session (use `cancel`): a caller that went away must not leave half-torn-down processes."""
        run = await self._queue(session)
        return await asyncio.shield(run.done)

    async def _queue(self, session: SessionContext) -> SessionRun:
        sid = validate_session_id(session.session_id)
        await self.start()
        if sid in self._seen:
            raise KeyError(f"session {sid} is already known to node {self.id}")
        self._seen.add(sid)
        run = SessionRun(session, asyncio.get_running_loop().create_future())
        run.mark("queued")
        self._live[sid] = run
        self._init_queue.put_nowait(run)
        return run

    async def cancel(self, session_id: str) -> bool:
        run = self._live.get(session_id)
        if run is None or run.stage not in CANCELLABLE:
            return False
        work = run.work
        if work is not None:
            work.cancel()
            await asyncio.wait([work])  # its command's process group is ended by then
        await self._finish(run, SessionStatus.CANCELLED, "cancelled")
        return True

    async def statuses(self) -> dict[str, SessionStatus]:
        return {sid: run.status for sid, run in self._live.items()}

    async def stats(self) -> NodeStats:
        depth = Counter(run.stage for run in self._live.values())
        cfg = self.config
        return NodeStats(node_id=self.id, max_init_workers=cfg.init_workers, max_run_workers=cfg.run_workers,
                         max_postrun_workers=cfg.postrun_workers, init_queue_depth=depth[Stage.QUEUED],
                         init_inflight=depth[Stage.INIT], ready_depth=depth[Stage.READY],
                         run_inflight=depth[Stage.RUN], postrun_queue_depth=depth[Stage.POSTRUN_QUEUED],
                         postrun_inflight=depth[Stage.POSTRUN])

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(*(self.cancel(sid) for sid in list(self._live)))
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        for run in list(self._live.values()):  # POSTRUN work cut short by the shutdown
            await self._finish(run, SessionStatus.ERROR, "the node shut down during POSTRUN")
        await self.runtimes.close()
        await self.gateway.stop()

    # -- the pools ---------------------------------------------------------------------------------

    def _start_pools(self) -> None:
        self._init_queue: asyncio.Queue[SessionRun] = asyncio.Queue()
        self._ready_queue: asyncio.Queue[SessionRun] = asyncio.Queue()
        self._postrun_queue: asyncio.Queue[SessionRun] = asyncio.Queue()
        self._ready_slots = asyncio.Semaphore(self.config.run_workers)
        pools = ((self._init_queue, self._init_stage, self.config.init_workers),
                 (self._ready_queue, self._run_stage, self.config.run_workers),
                 (self._postrun_queue, self._postrun_stage, self.config.postrun_workers))
        self._workers = [asyncio.create_task(self._worker(queue, stage), name=f"{self.id}-{stage.__name__}")
                         for queue, stage, count in pools for _ in range(count)]

    async def _worker(self, queue: asyncio.Queue[SessionRun], stage: Worker) -> None:
        while True:
            run = await queue.get()
            if run.stage is not Stage.DONE:  # a cancelled session stays queued until a worker skips it
                await self._execute(run, stage)

    async def _execute(self, run: SessionRun, stage: Worker) -> None:
        """Run one stage as its own task, so cancelling the session does not stop the worker."""
        work = run.work = asyncio.create_task(stage(run))
        try:
            await work
        except asyncio.CancelledError:
            worker = asyncio.current_task()
            assert worker is not None  # stages run in the pools' worker tasks
            if worker.cancelling():
                raise  # the node shuts down; a cancelled session is ended by cancel()
        except StageFailure as exc:
            await self._finish(run, exc.status, str(exc))
        except Exception as exc:
            logger.exception("session %s failed in %s", run.session_id, run.stage)
            await self._finish(run, SessionStatus.ERROR, f"{run.stage}: {type(exc).__name__}: {exc}")
        finally:
            if run.work is work:  # the next stage's worker may have set its own already
                run.work = None

    # -- INIT --------------------------------------------------------------------------------------

    async def _init_stage(self, run: SessionRun) -> None:
        run.enter(Stage.INIT, SessionStatus.INITIALIZING, "init_start")
        run.deadline = asyncio.get_running_loop().time() + run.task.timeout_seconds
        try:
            async with asyncio.timeout_at(run.deadline):
                await self._prepare(run)
                run.mark("init_end")
                await self._ready_slots.acquire()
        except TimeoutError:
            raise StageFailure(SessionStatus.TIMEOUT, "the time budget ran out during INIT") from None
        run.holds_ready_slot = True
        run.enter(Stage.READY, SessionStatus.READY, "ready")
        self._ready_queue.put_nowait(run)

    async def _prepare(self, run: SessionRun) -> None:
        """Create and start the runtime, register the session with the gateway, run the prepare actions."""
        task = run.task
        try:
            run.runtime, gateway_url = await self.runtimes.create(task.runtime, run.session_id, task.task_id)
            await run.runtime.start()
        except RuntimeUnavailable as exc:  # no engine, a missing image
            raise StageFailure(SessionStatus.ERROR, str(exc)) from None
        via_proxy = self._via_proxy(task)
        key = await self.gateway.register(run.session_id, task.task_id, task.agent.harness,
                                          self._metadata(run, run.runtime))
        run.registered = True
        run.harness_ctx = HarnessContext(
            session_id=run.session_id, session_key=key, task_id=task.task_id, instruction=task.instruction,
            gateway_url=gateway_url, layout=run.runtime.layout, model_name=task.agent.model_name,
            settings=task.agent.settings, contained=task.runtime.backend != "local", via_proxy=via_proxy)
        await self._prepare_runtime(run, run.runtime)

    def _via_proxy(self, task: TaskRequest) -> bool:
        if task.agent.capture != "proxy":
            return False
        if not self.config.gateway_proxies:
            raise StageFailure(SessionStatus.ERROR, "agent.capture 'proxy' needs a gateway in proxy mode "
                                                    "(tracetap rollout serve --gateway-mode proxy)")
        return True

    def _metadata(self, run: SessionRun, runtime: Runtime) -> dict:
        """What the sessions row carries: the host workspace (the evaluator runs there) and provenance."""
        layout = runtime.layout
        workspace = Path(runtime.session_dir) / Path(layout.workspace).relative_to(layout.root)
        metadata = {"workspace": str(workspace), "sample_index": run.ctx.sample_index, "node_id": self.id,
                    "max_staleness": run.task.max_staleness}  # the builders' trainability rule reads it
        return {**metadata, "task_metadata": run.task.metadata} if run.task.metadata else metadata

    async def _prepare_runtime(self, run: SessionRun, runtime: Runtime) -> None:
        """The task's prepare actions, in the session's runtime (INIT) or its fresh evaluation runtime."""
        for number, action in enumerate(run.task.runtime.prepare):
            await self._prepare_action(run, runtime, number, action)

    async def _prepare_action(self, run: SessionRun, runtime: Runtime, number: int, action: PrepareAction) -> None:
        if action.type != "exec":
            assert action.source and action.target  # PrepareAction's validator: an upload names both
            try:
                await runtime.upload(Path(action.source), action.target)
            except (OSError, ValueError) as exc:  # a missing source, a target outside the session
                raise StageFailure(SessionStatus.ERROR, f"prepare step {number}: {exc}") from None
            return
        assert action.command  # PrepareAction's validator: an exec has a command
        result = await runtime.exec(action.command, env={**self._runtime_env(run, runtime), **action.env},
                                    log_name=f"prepare.{number:02d}", cwd=action.cwd, timeout=run.remaining())
        if result.timed_out:
            raise StageFailure(SessionStatus.TIMEOUT, f"prepare step {number} ran out of the time budget")
        if result.returncode != 0:
            raise StageFailure(SessionStatus.ERROR, f"prepare step {number} exited with {result.returncode}"
                                                    f"{last_line(result.stderr_path)} (see {result.stderr_path})")

    def _runtime_env(self, run: SessionRun, runtime: Runtime | None = None) -> dict[str, str]:
        """The env of every prepare, run and post-run command (reference system §5.6), then the spec's; its
        folders are those of `runtime` (default: the session's own)."""
        _, ctx = run.prepared()
        ctx = ctx if runtime is None else replace(ctx, layout=runtime.layout)
        return {**gateway_env(ctx), "SAMPLE_INDEX": str(run.ctx.sample_index), **run.task.runtime.env}

    def _agent_env(self, run: SessionRun) -> dict[str, str]:
        """Run and post-run steps add the preset's env and the task's agent env."""
        harness = HARNESSES[run.task.agent.harness]
        _, ctx = run.prepared()
        return {**self._runtime_env(run), **harness.env(ctx), **run.task.agent.env}

    # -- RUN ---------------------------------------------------------------------------------------

    async def _run_stage(self, run: SessionRun) -> None:
        self._leave_ready(run)
        run.enter(Stage.RUN, SessionStatus.RUNNING, "run_start")
        if eval_runtime.needs_fresh_runtime(run):  # off the critical path: ready by POSTRUN
            run.fresh = eval_runtime.FreshRuntime(run, self.runtimes, partial(self._prepare_runtime, run))
        try:
            await self._run_harness(run)
        except Exception as exc:  # a preset refusing its settings, a file it could not write, ...
            logger.warning("session %s: harness failed: %s", run.session_id, exc)
            run.verdict, run.error = SessionStatus.ERROR, f"harness: {exc}"
        run.mark("run_end")
        run.enter(Stage.POSTRUN_QUEUED, SessionStatus.POST_RUN, "postrun_queued")
        self._postrun_queue.put_nowait(run)

    async def _run_harness(self, run: SessionRun) -> None:
        harness = HARNESSES[run.task.agent.harness]
        runtime, ctx = run.prepared()
        for target, text in harness.files(ctx).items():
            await runtime.write_text(target, text)
        for step in harness.run_steps(ctx):
            result = await self._step(run, step, run.remaining())
            if result.timed_out:
                run.verdict, run.error = SessionStatus.TIMEOUT, f"step {step.name} ran out of the time budget"
                return
            if result.returncode != 0:
                run.verdict = SessionStatus.ERROR
                run.error = f"step {step.name} exited with {result.returncode} (see {result.stderr_path})"
                return

    async def _step(self, run: SessionRun, step: Step, timeout: float) -> ExecResult:
        runtime, _ = run.prepared()
        return await runtime.exec(step.command, env={**self._agent_env(run), **step.env},
                                  log_name=f"agent/{step.name}", cwd=step.cwd, timeout=timeout)

    # -- POSTRUN -----------------------------------------------------------------------------------

    async def _postrun_stage(self, run: SessionRun) -> None:
        run.enter(Stage.POSTRUN, SessionStatus.POST_RUN, "postrun_start")
        loop = asyncio.get_running_loop()
        deadline = max(run.budget_end(), loop.time() + self.config.postrun_grace)
        try:
            async with asyncio.timeout_at(deadline):
                await self._wrap_up(run, deadline)
        except TimeoutError:
            raise StageFailure(SessionStatus.ERROR, "POSTRUN ran out of time") from None
        run.mark("postrun_end")
        await self._finish(run, run.verdict)

    async def _wrap_up(self, run: SessionRun, deadline: float) -> None:
        """Post-run steps, close, build, evaluate (the runtime still up), end every process, join."""
        harness = HARNESSES[run.task.agent.harness]
        runtime, ctx = run.prepared()
        for step in harness.postrun_steps(ctx):  # e.g. copying transcripts: never the verdict
            result = await self._step(run, step, max(0.0, deadline - asyncio.get_running_loop().time()))
            if result.returncode != 0:
                logger.warning("session %s: post-run step %s exited with %s", run.session_id, step.name,
                               result.returncode)
        has_calls = await self.gateway.close_session(run.session_id)
        if has_calls:
            await self._build(run)
        evaluator = run.task.evaluator
        score = await self._evaluate(run, evaluator, deadline) if evaluator else None
        await runtime.teardown()
        if has_calls:
            rollout = {"status": str(run.verdict), "error": run.error, "node_id": self.id}
            await asyncio.to_thread(postrun.finish_traces, self.store, run.session_id, run.task.builder, score,
                                    rollout)

    async def _build(self, run: SessionRun) -> None:
        run.status = SessionStatus.BUILDING
        run.traces = await asyncio.to_thread(postrun.build_session, self.store, run.session_id, run.task.builder)
        run.prompt_tokens, run.completion_tokens = await asyncio.to_thread(postrun.token_totals, self.store,
                                                                           run.session_id)

    async def _evaluate(self, run: SessionRun, evaluator: EvaluatorSpec,
                        deadline: float) -> postrun.SessionScore | None:
        run.status = SessionStatus.EVALUATING
        try:
            tools = await eval_runtime.session_tools(run, partial(self._runtime_env, run))
        except eval_runtime.FreshRuntimeError as exc:
            run.verdict, run.error = SessionStatus.ERROR, str(exc)
            return None
        timeout = max(1.0, deadline - asyncio.get_running_loop().time())
        score = await asyncio.to_thread(postrun.score_session, self.store, run.session_id, run.task.builder,
                                        evaluator, timeout, tools)
        run.reward = score.reward
        if score.error and run.verdict is SessionStatus.COMPLETED:  # no usable reward: not a completed sample
            run.verdict, run.error = SessionStatus.ERROR, f"evaluator failed: {score.error}"
        return score

    # -- the end of a session ----------------------------------------------------------------------

    def _leave_ready(self, run: SessionRun) -> None:
        if run.holds_ready_slot:
            run.holds_ready_slot = False
            self._ready_slots.release()

    async def _finish(self, run: SessionRun, status: SessionStatus, error: str | None = None) -> None:
        """End the session once: free its READY slot, tear it down, close it, report its result."""
        if run.stage is Stage.DONE:
            return
        ended_in, run.stage, run.status = run.stage, Stage.DONE, status
        run.error = error or run.error
        self._leave_ready(run)
        await asyncio.shield(self._release(run, close=ended_in is not Stage.POSTRUN))
        run.mark("end")
        self._live.pop(run.session_id, None)
        run.done.set_result(run.result(self.id))

    async def _release(self, run: SessionRun, close: bool) -> None:
        """Best-effort cleanup of a session that did not get through POSTRUN (or failed in it)."""
        try:
            if run.fresh is not None:
                await run.fresh.close()
            if run.runtime is not None:
                await run.runtime.teardown()
            if close and run.registered:
                await self.gateway.close_session(run.session_id)
        except (GatewayError, OSError) as exc:
            logger.warning("cleanup of session %s: %s", run.session_id, exc)


def last_line(path: Path, limit: int = 300) -> str:
    """`: <the last non-empty line of a log>` (the reason a command gave), or '' when it said nothing."""
    lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return f": {lines[-1][-limit:]}" if lines else ""
