"""The rollout server over HTTP (FastAPI): a trainer submits TaskRequests and polls or gets called back.

Routes: `POST /tasks`, `GET|DELETE /tasks/{id}`, `GET /tasks/{id}/samples?format=...`, `GET /sessions/{id}`,
`GET /status`, and the reference system's `POST /rollout/task/submit`, `GET /rollout/task/{id}`,
`GET /rollout/status`. The app holds one RolloutManager; `lifespan` builds it with its nodes (the
server's own in-process nodes sharing one gateway, see rollout/nodes.py) and tears them down.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pydantic
import uvicorn
from fastapi import BackgroundTasks, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse
from tracetap.builders.exports import FORMATS, ExportError, export
from tracetap.rollout import reference
from tracetap.rollout.manager import RolloutManager, TaskConflict, UnknownTask
from tracetap.rollout.models import TaskRequest, TaskResult
from tracetap.store.paths import task_file

ManagerFactory = Callable[[], AbstractAsyncContextManager[RolloutManager]]


def create_app(managed: ManagerFactory) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with managed() as manager:
            app.state.manager = manager
            yield

    app = FastAPI(title="tracetap rollout server", lifespan=lifespan)
    _task_routes(app)
    _reference_routes(app)
    return app


def _manager(request: Request) -> RolloutManager:
    return request.app.state.manager


def _task_routes(app: FastAPI) -> None:
    @app.post("/tasks", status_code=202)
    async def submit(task: TaskRequest, request: Request) -> dict[str, Any]:
        result = _submit(_manager(request), task)
        return {"task_id": result.task_id, "status": result.status, "session_ids": result.session_ids}

    @app.get("/tasks/{task_id}")
    async def task(task_id: str, request: Request) -> TaskResult:
        return _known(lambda: _manager(request).task_result(task_id))

    @app.delete("/tasks/{task_id}", status_code=202)
    async def cancel(task_id: str, request: Request) -> TaskResult:
        manager = _manager(request)
        _known(lambda: manager.runs[task_id])
        return await manager.cancel(task_id)

    @app.get("/tasks/{task_id}/samples")
    async def samples(task_id: str, request: Request, background: BackgroundTasks,
                      format: str = "jsonl") -> FileResponse:
        manager = _manager(request)
        record = _known(lambda: manager.records[task_id])
        out = await asyncio.to_thread(_export, manager, record.request, record.result, format)
        background.add_task(shutil.rmtree, out.parent, ignore_errors=True)
        return FileResponse(out, filename=out.name)

    @app.get("/sessions/{session_id}")
    async def session(session_id: str, request: Request) -> dict[str, Any]:
        manager = _manager(request)
        task, result = _known(lambda: manager.session_result(session_id))
        status = result.status if result else await manager.live_status(task.task_id, session_id)
        return {"session_id": session_id, "task_id": task.task_id, "status": status,
                "result": result.model_dump(mode="json") if result else None}

    @app.get("/status")
    async def status(request: Request) -> dict[str, Any]:
        return await _status(_manager(request))


def _reference_routes(app: FastAPI) -> None:
    @app.post("/rollout/task/submit")
    async def submit(body: dict[str, Any], request: Request) -> dict[str, Any]:
        try:
            task = reference.to_task_request(body)
        except pydantic.ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None
        result = _submit(_manager(request), task)
        return {"task_id": result.task_id, "status": "submitted", "session_ids": result.session_ids}

    @app.get("/rollout/task/{task_id}")
    async def task(task_id: str, request: Request) -> dict[str, Any]:
        manager = _manager(request)
        result = _known(lambda: manager.task_result(task_id))
        return reference.task_result(result, str(task_file(manager.results.root, task_id)))

    @app.get("/rollout/status")
    async def status(request: Request) -> dict[str, Any]:
        return await _status(_manager(request))


def _submit(manager: RolloutManager, task: TaskRequest) -> TaskResult:
    try:
        return manager.submit(task)
    except TaskConflict as exc:
        raise HTTPException(409, str(exc)) from None


def _known(lookup: Callable[[], Any]) -> Any:
    try:
        return lookup()
    except (UnknownTask, KeyError) as exc:
        raise HTTPException(404, f"unknown task or session {exc}") from None


async def _status(manager: RolloutManager) -> dict[str, Any]:
    nodes = await manager.pool.stats()
    running = sum(1 for run in manager.runs.values() if not run.runner.done())
    return {"nodes": [{**s.model_dump(), "total_sessions": s.total_sessions} for s in nodes],
            "tasks": {"running": running, "known": len(manager.records)}}


def _export(manager: RolloutManager, task: TaskRequest, result: TaskResult, fmt: str) -> Path:
    """The task's traces with rewards, in one file (atif's folder of files comes zipped)."""
    if fmt not in FORMATS:
        raise HTTPException(422, f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    folder = Path(tempfile.mkdtemp(prefix="tracetap-samples-"))
    out = folder / f"{task.task_id}.{'parquet' if fmt == 'parquet' else 'json' if fmt == 'atif' else 'jsonl'}"
    evaluator = task.evaluator.name if task.evaluator else None
    try:
        export(manager.results.root, task.builder, fmt, out, evaluator=evaluator, force=True,
               session_ids=set(result.session_ids))
    except ExportError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise HTTPException(409, str(exc)) from None
    return Path(shutil.make_archive(str(out), "zip", out)) if out.is_dir() else out


class ServerThread:
    """The app under uvicorn on a background thread (the demo and tests); `url` once started."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, name="rollout-server", daemon=True)
        self.url = ""

    def start(self, timeout: float = 300.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the rollout server did not start (see its log)")
            time.sleep(0.05)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=120)

    def __enter__(self) -> ServerThread:
        return self if self.url else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
