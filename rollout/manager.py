"""The rollout server's core, free of HTTP: tasks in, sessions onto nodes, results persisted, callback out.

`submit` validates nothing itself (the TaskRequest model did) and refuses a task id that is still
running; everything else happens in background tasks. Each session waits for an eligible node
(scheduler.NodePool), runs there, and its result is written into the task's record in the store as
soon as it ends. A session whose node was lost before it started goes to another node; one whose node
was lost while it ran ends ERROR `node_lost`. When every session has ended, the TaskResult is
persisted, then POSTed to the callback URL in the background; how that went (`TaskResult.callback`)
is persisted after every attempt.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from tracetap.rollout import callbacks
from tracetap.rollout.models import (
    TERMINAL,
    CallbackState,
    SessionContext,
    SessionResult,
    SessionStatus,
    TaskRequest,
    TaskResult,
    new_session_id,
)
from tracetap.rollout.node_api import NODE_LOST, SessionNotStarted
from tracetap.rollout.results import ResultStore, TaskRecord
from tracetap.rollout.scheduler import NodePool, NoNodes

logger = logging.getLogger("tracetap.rollout.manager")
CANCEL_RETRY = 0.05  # seconds between attempts to cancel a session a node has not queued yet


class TaskConflict(ValueError):
    """A task id that is still running."""


class UnknownTask(KeyError):
    pass


@dataclass
class TaskRun:
    record: TaskRecord
    contexts: list[SessionContext]
    where: dict[str, str] = field(default_factory=dict)  # session id -> node id it runs on
    cancelled: bool = False
    runner: asyncio.Task = field(init=False)  # set by `submit` right after the run is made


class RolloutManager:
    """Construct it inside the event loop it serves: callbacks an earlier server left pending resume."""

    def __init__(self, pool: NodePool, results: ResultStore,
                 callback_policy: callbacks.RetryPolicy = callbacks.DEFAULT_RETRY) -> None:
        self.pool = pool
        self.results = results
        self.callback_policy = callback_policy
        self.records = results.load_all()  # finished tasks of earlier servers stay answerable
        self.runs: dict[str, TaskRun] = {}
        self.deliveries: dict[str, asyncio.Task] = {}  # task id -> its callback being delivered
        for record in self.records.values():
            if record.result.callback is not None and record.result.callback.status == "pending":
                self._send_callback(record, record.result.callback)

    def submit(self, request: TaskRequest) -> TaskResult:
        run = self.runs.get(request.task_id)
        if run is not None and not run.runner.done():
            raise TaskConflict(f"task {request.task_id!r} is still running")
        if request.task_id in self.deliveries:  # the earlier run's result is replaced: so is its callback
            self.deliveries.pop(request.task_id).cancel()
        contexts = [SessionContext(session_id=new_session_id(), task=request, sample_index=n)
                    for n in range(request.num_samples)]
        result = TaskResult(task_id=request.task_id, status="running", session_ids=[c.session_id for c in contexts],
                            submitted_at=datetime.now(UTC))
        run = TaskRun(TaskRecord(request, result), contexts)
        self.results.save(run.record)
        self.records[request.task_id] = run.record
        self.runs[request.task_id] = run
        run.runner = asyncio.create_task(self._run_task(run), name=f"task-{request.task_id}")
        return result

    def record(self, task_id: str) -> TaskRecord:
        if task_id not in self.records:
            raise UnknownTask(task_id)
        return self.records[task_id]

    def task_result(self, task_id: str) -> TaskResult:
        return self.record(task_id).result

    async def live_status(self, task_id: str, session_id: str) -> SessionStatus:
        """Where an unfinished session is now: its node's view, REGISTERED before it reaches one."""
        run = self.runs.get(task_id)
        node = self.pool.nodes.get(run.where.get(session_id, "")) if run else None
        statuses = await node.statuses() if node is not None else {}
        return statuses.get(session_id, SessionStatus.REGISTERED)

    def session_result(self, session_id: str) -> tuple[TaskResult, SessionResult | None]:
        """The session's task and its result (None while it runs)."""
        for record in self.records.values():
            if session_id in record.result.session_ids:
                done = {r.session_id: r for r in record.result.results}
                return record.result, done.get(session_id)
        raise UnknownTask(session_id)

    async def cancel(self, task_id: str) -> TaskResult:
        run = self.runs.get(task_id)
        if run is None:
            raise UnknownTask(task_id)
        run.cancelled = True
        pending = [c.session_id for c in run.contexts if not self._ended(run, c.session_id)]
        await asyncio.gather(*(self._cancel_session(run, sid) for sid in pending))
        return run.record.result

    async def wait(self, task_id: str) -> TaskResult:
        await asyncio.shield(self.runs[task_id].runner)
        return self.task_result(task_id)

    async def close(self) -> None:
        """Cancel running tasks and wait for them; a callback still being retried stays pending in its
        record (the next server on this store resumes it)."""
        for run in self.runs.values():
            if not run.runner.done():
                await self.cancel(run.record.request.task_id)
        await asyncio.gather(*(run.runner for run in self.runs.values()), return_exceptions=True)
        deliveries = list(self.deliveries.values())
        for delivery in deliveries:
            delivery.cancel()
        await asyncio.gather(*deliveries, return_exceptions=True)

    # -- one task ----------------------------------------------------------------------------------

    async def _run_task(self, run: TaskRun) -> None:
        await asyncio.gather(*(self._run_session(run, ctx) for ctx in run.contexts))
        result = run.record.result
        result.status = "cancelled" if run.cancelled else _task_status(result.results)
        result.finished_at = datetime.now(UTC)
        result.results.sort(key=lambda r: result.session_ids.index(r.session_id))
        if run.record.request.callback_url is not None:
            result.callback = CallbackState()
        self.results.save(run.record)  # persisted before the callback, always
        if result.callback is not None:
            self._send_callback(run.record, result.callback)

    def _send_callback(self, record: TaskRecord, state: CallbackState) -> None:
        """Deliver in the background: the task is over (and answerable) while the receiver is retried."""
        task_id = record.request.task_id
        payload = record.result.model_dump(mode="json", exclude={"callback"})
        self.deliveries[task_id] = asyncio.create_task(callbacks.deliver(
            str(record.request.callback_url), payload, state,
            lambda: self.results.save(record), self.callback_policy), name=f"callback-{task_id}")
        self.deliveries[task_id].add_done_callback(lambda done: self._delivered(task_id, done))

    def _delivered(self, task_id: str, done: asyncio.Task) -> None:
        if self.deliveries.get(task_id) is done:
            del self.deliveries[task_id]

    async def _run_session(self, run: TaskRun, ctx: SessionContext) -> None:
        result = await self._dispatch(run, ctx)
        run.record.result.results.append(result)
        self.results.save(run.record)

    async def _dispatch(self, run: TaskRun, ctx: SessionContext) -> SessionResult:
        while not run.cancelled:
            try:
                node_id = await self.pool.acquire()
            except NoNodes as exc:
                return _ended(ctx, SessionStatus.ERROR, str(exc))
            run.where[ctx.session_id] = node_id
            try:
                return await self._on_node(run, ctx, node_id)
            except SessionNotStarted:
                logger.warning("node %s was lost before %s started; sending it elsewhere", node_id, ctx.session_id)
                await self.pool.remove(node_id)
            finally:
                await self.pool.release(node_id)
        return _ended(ctx, SessionStatus.CANCELLED, "cancelled before it reached a node")

    async def _on_node(self, run: TaskRun, ctx: SessionContext, node_id: str) -> SessionResult:
        if run.cancelled:
            return _ended(ctx, SessionStatus.CANCELLED, "cancelled before it reached a node")
        try:
            return await self.pool.nodes[node_id].run_session(ctx)
        except SessionNotStarted:
            raise
        except Exception as exc:  # the node died or broke under this session
            logger.exception("node %s lost session %s", node_id, ctx.session_id)
            await self.pool.remove(node_id)
            return _ended(ctx, SessionStatus.ERROR, f"{NODE_LOST}: {type(exc).__name__}: {exc}", node_id)

    async def _cancel_session(self, run: TaskRun, session_id: str) -> None:
        """Ask the session's node until it ends it (the dispatch may still be on its way there)."""
        while not self._ended(run, session_id):
            node = self.pool.nodes.get(run.where.get(session_id, ""))
            if node is not None and await node.cancel(session_id):
                return
            await asyncio.sleep(CANCEL_RETRY)

    @staticmethod
    def _ended(run: TaskRun, session_id: str) -> bool:
        return any(r.session_id == session_id for r in run.record.result.results)


def _ended(ctx: SessionContext, status: SessionStatus, error: str, node_id: str | None = None) -> SessionResult:
    return SessionResult(session_id=ctx.session_id, task_id=ctx.task.task_id, status=status, error=error,
                         node_id=node_id, finished_at=datetime.now(UTC))


def _task_status(results: list[SessionResult]) -> Literal["completed", "failed"]:
    """`failed` when no session got through; sessions carry their own statuses otherwise."""
    assert all(r.status in TERMINAL for r in results)
    return "failed" if all(r.status == SessionStatus.ERROR for r in results) else "completed"
