"""The rollout server's HTTP face (FastAPI): routes only; RolloutManager does the work.

Our routes (`/tasks`, `/sessions/{id}`, `/status`, `/tasks/{id}/samples`, `/admin/pause|resume|status` for
every node's gateway; submitting, cancelling and the fence need the control token) and the reference system's
(`/rollout/task/submit`, `/rollout/task/{id}`, `/rollout/status`). A TaskRequest that does not
validate is a 422 naming the field; a task id still running is a 409; neither creates anything.
`BackgroundServer` runs the app under uvicorn on its own thread (the CLI, the demo and the tests).
"""

from __future__ import annotations

import asyncio
import hmac
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import uvicorn
from fastapi import Body, Depends, FastAPI, Header, HTTPException, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from pydantic import ValidationError
from starlette.background import BackgroundTask
from tracetap.builders.exports import ExportError, export
from tracetap.rollout.callbacks import DEFAULT_RETRY, RetryPolicy
from tracetap.rollout.gateway_host import GatewayError
from tracetap.rollout.manager import RolloutManager, TaskConflict, UnknownTask
from tracetap.rollout.models import TaskRequest, TaskResult
from tracetap.rollout.node_api import Node
from tracetap.rollout.reference_api import from_reference, to_reference
from tracetap.rollout.results import ResultStore
from tracetap.rollout.scheduler import NodePool

from tracetap.control import control_token

NodeFactory = Callable[[], Sequence[Node]]
MEDIA = {"parquet": "application/vnd.apache.parquet", "verl": "application/vnd.apache.parquet",
         "jsonl": "application/x-ndjson", "slime": "application/x-ndjson", "atif": "application/zip"}


def create_app(store: Path, make_nodes: NodeFactory, callback_policy: RetryPolicy = DEFAULT_RETRY) -> FastAPI:
    """`make_nodes` runs inside the server's event loop, so the nodes' asyncio state lives there."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nodes = list(make_nodes())
        ids = await asyncio.gather(*(node.node_id() for node in nodes))
        app.state.manager = RolloutManager(NodePool(dict(zip(ids, nodes, strict=True))), ResultStore(store),
                                           callback_policy)
        yield
        await app.state.manager.close()
        await asyncio.gather(*(node.shutdown() for node in nodes))

    app = FastAPI(title="tracetap rollout server", lifespan=lifespan)
    _task_routes(app)
    _query_routes(app, store)
    _reference_routes(app, store)
    _admin_routes(app)
    return app


def _control_token_presented(authorization: Annotated[str, Header()] = "") -> None:
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), control_token().encode()):
        raise HTTPException(401, "this endpoint needs the control token (Authorization: Bearer <token>)")


# What changes the fleet (the fence, submitting or cancelling a task) needs the control token, like the
# gateways' own endpoints (tracetap/control.py): else any local process, the agent under training included,
# could move the fence or cancel its own task. Reading stays open: session ids grant nothing.
GUARDED = [Depends(_control_token_presented)]


def _admin_routes(app: FastAPI) -> None:
    """A trainer's fence for the whole fleet: each call goes to every node's gateway."""
    @app.post("/admin/pause", dependencies=GUARDED)
    async def pause(body: Annotated[dict | None, Body()] = None) -> JSONResponse:
        return await _to_gateways(app, "pause", body)

    @app.post("/admin/resume", dependencies=GUARDED)
    async def resume(body: Annotated[dict | None, Body()] = None) -> JSONResponse:
        return await _to_gateways(app, "resume", body)

    @app.get("/admin/status", dependencies=GUARDED)
    async def admin_status() -> JSONResponse:
        return await _to_gateways(app, "status", None)


async def _to_gateways(app: FastAPI, action: str, body: dict | None) -> JSONResponse:
    """`{gateways: {url: answer}}` with the worst status any gateway answered. Nodes sharing a gateway ask it
    more than once: pausing, resuming and asking are idempotent."""
    nodes = _manager(app).pool.nodes.values()
    try:
        answers = await asyncio.gather(*(node.gateway_admin(action, body) for node in nodes))
    except GatewayError as exc:
        raise HTTPException(502, str(exc)) from None
    by_url = {answer.url: answer for answer in answers}
    status = max(answer.status for answer in by_url.values())
    return JSONResponse({"gateways": {url: answer.body for url, answer in by_url.items()}}, status_code=status)


def _manager(app: FastAPI) -> RolloutManager:
    return app.state.manager


def _submit(app: FastAPI, request: TaskRequest) -> TaskResult:
    try:
        return _manager(app).submit(request)
    except TaskConflict as exc:
        raise HTTPException(409, str(exc)) from None


def _known(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except UnknownTask as exc:
        raise HTTPException(404, f"unknown task or session {exc.args[0]!r}") from None


def _task_routes(app: FastAPI) -> None:
    @app.post("/tasks", dependencies=GUARDED)
    async def submit_task(request: TaskRequest) -> TaskResult:
        return _submit(app, request)

    @app.get("/tasks/{task_id}")
    async def get_task(task_id: str) -> TaskResult:
        return _known(lambda: _manager(app).task_result(task_id))

    @app.delete("/tasks/{task_id}", dependencies=GUARDED)
    async def cancel_task(task_id: str) -> TaskResult:
        try:
            return await _manager(app).cancel(task_id)
        except UnknownTask:
            raise HTTPException(404, f"no running task {task_id!r}") from None


def _query_routes(app: FastAPI, store: Path) -> None:
    @app.get("/sessions/{session_id}")
    async def get_session(session_id: str) -> dict:
        task, result = _known(lambda: _manager(app).session_result(session_id))
        if result is not None:
            return result.model_dump(mode="json")
        status = await _manager(app).live_status(task.task_id, session_id)
        return {"session_id": session_id, "task_id": task.task_id, "status": status}

    @app.get("/status")
    async def status() -> dict:
        return await _status(app)

    @app.get("/tasks/{task_id}/samples")
    async def samples(task_id: str, format: str = Query("parquet")) -> FileResponse:
        record = _known(lambda: _manager(app).record(task_id))
        return await asyncio.to_thread(_export_samples, store, record.request, record.result, format)


async def _status(app: FastAPI) -> dict:
    manager = _manager(app)
    nodes = await manager.pool.stats()
    running = [tid for tid, run in manager.runs.items() if not run.runner.done()]
    return {"nodes": [{**s.model_dump(), "total_sessions": s.total_sessions, "admission_limit": s.admission_limit}
                      for s in nodes], "running_tasks": running}


def _export_samples(store: Path, request: TaskRequest, result: TaskResult, fmt: str) -> FileResponse:
    """Export the task's sessions to a temp file, streamed back and removed after the response."""
    folder = Path(tempfile.mkdtemp(prefix="tracetap-samples-"))
    out = folder / f"{request.task_id}.{fmt}"
    evaluator = request.evaluator.name if request.evaluator else None
    try:
        export(store, request.builder, fmt, out, evaluator=evaluator, session_ids=result.session_ids)
    except ExportError as exc:
        _remove(folder)
        raise HTTPException(404 if "no trajectories" in str(exc) else 422, str(exc)) from None
    if out.is_dir():  # atif: a folder of documents
        out = Path(shutil.make_archive(str(out), "zip", out))
    return FileResponse(out, media_type=MEDIA.get(fmt, "application/octet-stream"), filename=out.name,
                        background=BackgroundTask(_remove, folder))


def _remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def _reference_routes(app: FastAPI, store: Path) -> None:
    @app.post("/rollout/task/submit", dependencies=GUARDED)
    async def reference_submit(body: Annotated[Any, Body()]) -> dict:
        try:
            request = from_reference(body)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None
        return to_reference(_submit(app, request), store)

    @app.get("/rollout/task/{task_id}")
    async def reference_task(task_id: str) -> dict:
        return to_reference(_known(lambda: _manager(app).task_result(task_id)), store)

    @app.get("/rollout/status")
    async def reference_status() -> dict:
        return await _status(app)


class BackgroundServer:
    """uvicorn on a daemon thread; `start()` returns once it listens, `stop()` ends tasks and nodes."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, name="rollout-server", daemon=True)

    def start(self, timeout: float = 60.0) -> str:
        self.thread.start()
        ready = threading.Event()
        while not self.server.started and self.thread.is_alive() and not ready.wait(0.05):
            timeout -= 0.05
            if timeout <= 0:
                raise RuntimeError("the rollout server did not start")
        if not self.server.started:
            raise RuntimeError("the rollout server failed to start")
        return self.url

    @property
    def url(self) -> str:
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join()

    def __enter__(self) -> BackgroundServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
