"""Evaluators get the session's runtimes: a synchronous bridge to the node's loop, and a fresh runtime.

An evaluator runs in a thread during POSTRUN; `RuntimeBridge` turns its calls into coroutines on the
node's event loop (`run_coroutine_threadsafe`), so it drives the same `Runtime` the harness ran in. An
evaluator class that sets `needs_fresh_runtime` also gets a second runtime from the same spec (id
`<session>-eval`, prepared with the task's prepare actions), started when RUN starts so it is ready by
POSTRUN; the session's timeline records `eval_runtime_start` and `eval_runtime_ready`. The node closes it
when the session ends, whatever the path (completed, error, timeout, cancel, shutdown).
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tracetap.evaluators.base import resolve
from tracetap.evaluators.runner import SessionTools
from tracetap.evaluators.runtime import CommandResult
from tracetap.rollout.runtimes.base import Runtime

if TYPE_CHECKING:
    from tracetap.rollout.runtimes import NodeRuntimes
    from tracetap.rollout.session_run import SessionRun

T = TypeVar("T")
CALL_MARGIN_SECONDS = 60.0   # a bridged call waits this long beyond its own timeout before giving up
FILE_CALL_SECONDS = 300.0    # bound on a bridged file copy or read
SUFFIX = "-eval"


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


class RuntimeBridge:
    """Implements `evaluators.runtime.EvalRuntime` over an async `Runtime`, called from another thread."""

    def __init__(self, runtime: Runtime, loop: asyncio.AbstractEventLoop, env: Mapping[str, str]) -> None:
        self.runtime, self.loop, self.env = runtime, loop, dict(env)
        self.scratch = posixpath.join(runtime.layout.root, "eval")

    def _call(self, coro: Coroutine[Any, Any, T], seconds: float) -> T:
        """Run `coro` on the node's loop; bounded, so a thread left behind by a stopped loop still ends."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(seconds)

    def exec(self, command: str, *, timeout: float, log_name: str, env: Mapping[str, str] | None = None,
             cwd: str | None = None) -> CommandResult:
        running = self.runtime.exec(command, env={**self.env, **(env or {})}, log_name=log_name, cwd=cwd,
                                    timeout=timeout)
        done = self._call(running, timeout + CALL_MARGIN_SECONDS)
        return CommandResult(done.returncode, _text(done.stdout_path), _text(done.stderr_path))

    def read_text(self, path: str) -> str:
        return self._call(self.runtime.read_text(path), FILE_CALL_SECONDS)

    def write_text(self, path: str, text: str) -> None:
        self._call(self.runtime.write_text(path, text), FILE_CALL_SECONDS)

    def upload(self, source: Path, target: str) -> None:
        self._call(self.runtime.upload(Path(source), target), FILE_CALL_SECONDS)


class FreshRuntimeError(RuntimeError):
    """The evaluation runtime could not be started or prepared."""


class FreshRuntime:
    """A session's evaluation runtime, being started in the background from the moment it is made."""

    def __init__(self, run: SessionRun, runtimes: NodeRuntimes, prepare: Callable[[Runtime], Awaitable[None]]):
        self.runtime: Runtime | None = None
        self._starting = asyncio.create_task(self._start(run, runtimes, prepare),
                                             name=f"{run.session_id}{SUFFIX}-start")

    async def _start(self, run: SessionRun, runtimes: NodeRuntimes,
                     prepare: Callable[[Runtime], Awaitable[None]]) -> Runtime:
        run.mark("eval_runtime_start")
        async with asyncio.timeout_at(run.deadline):
            self.runtime, _ = await runtimes.create(run.task.runtime, run.session_id + SUFFIX, run.task.task_id)
            await self.runtime.start()
            await prepare(self.runtime)
        run.mark("eval_runtime_ready")
        return self.runtime

    async def ready(self) -> Runtime:
        """The started runtime (waiting for it if need be), or FreshRuntimeError with the reason."""
        try:
            return await asyncio.shield(self._starting)
        except TimeoutError:
            raise FreshRuntimeError("evaluation runtime: the time budget ran out while it started") from None
        except Exception as exc:
            raise FreshRuntimeError(f"evaluation runtime: {exc}") from None

    async def close(self) -> None:
        """Stop a start still under way and remove the runtime; idempotent."""
        self._starting.cancel()
        await asyncio.wait([self._starting])
        if not self._starting.cancelled():
            self._starting.exception()  # reported by ready(), or nobody asked: retrieved either way
        runtime, self.runtime = self.runtime, None
        if runtime is not None:
            await runtime.teardown()


def needs_fresh_runtime(run: SessionRun) -> bool:
    return run.task.evaluator is not None and resolve(run.task.evaluator.name).needs_fresh_runtime


async def session_tools(run: SessionRun, env_for: Callable[[Runtime], Mapping[str, str]]) -> SessionTools:
    """The evaluator's runtimes (bridged to this loop, each with `env_for(it)`) and its logs folder,
    `<session>/logs/eval`."""
    loop = asyncio.get_running_loop()
    fresh = await run.fresh.ready() if run.fresh is not None else None
    runtime, _ = run.prepared()
    logs_dir = Path(runtime.session_dir) / "logs" / "eval"
    logs_dir.mkdir(parents=True, exist_ok=True)

    def bridge(runtime: Runtime) -> RuntimeBridge:
        return RuntimeBridge(runtime, loop, env_for(runtime))

    return SessionTools(runtime=bridge(runtime), logs_dir=logs_dir,
                        fresh_runtime=bridge(fresh) if fresh is not None else None)
