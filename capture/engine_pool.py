"""Several engines behind one gateway (`--upstream` given more than once): an `Upstream` over a pool.

Each session sticks to the engine it started on, so its growing prompt keeps hitting that engine's prefix
cache. A new session goes to the healthy engine with the fewest calls in flight (then the fewest
sessions). An engine whose connection fails is taken out at once (the call in flight fails, as it would
with one engine; the harness retries) and its sessions move to the others on their next call, which is
recorded with `engine_moved_from` in its metadata: the prefix cache was lost, the tokens are still exact.
A health check puts it back once `/health` answers again. Every call names its engine (`engine` column).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tracetap.capture.bounded import LruDict
from tracetap.capture.upstream import LiveChatStream, UpstreamClient, UpstreamError, UpstreamResult

logger = logging.getLogger("tracetap.gateway")
MAX_SESSIONS = 65536  # session -> engine assignments kept (most recent)
HEALTH_EVERY = 2.0  # seconds between health checks of the engines taken out
T = TypeVar("T")


@dataclass
class Engine:
    client: UpstreamClient
    healthy: bool = True
    in_flight: int = 0
    calls: int = 0
    sessions: int = 0  # sessions placed here (a session that moves away is not taken off)

    @property
    def url(self) -> str:
        return self.client.base_url

    def to_json(self) -> dict:
        return {"healthy": self.healthy, "in_flight": self.in_flight, "calls": self.calls,
                "sessions": self.sessions}


class EnginePool:
    """Implements `capture.upstream.Upstream` by sending each session to one engine of the pool."""

    def __init__(self, clients: list[UpstreamClient], health_every: float = HEALTH_EVERY) -> None:
        if len({client.base_url for client in clients}) != len(clients) or not clients:
            raise ValueError("an engine pool needs distinct upstream URLs")
        self.engines = [Engine(client) for client in clients]
        self.health_every = health_every
        self.placed: LruDict[str, Engine] = LruDict(MAX_SESSIONS)
        self.models: list[str] = []
        self.served_model: str | None = clients[0].served_model
        self._health: asyncio.Task | None = None

    async def discover(self) -> list[str]:
        """Every engine's model names (they serve one model: a pool is replicas of it); starts the checks."""
        await asyncio.gather(*(engine.client.discover() for engine in self.engines))
        self.models = list(dict.fromkeys(name for engine in self.engines for name in engine.client.models))
        self.served_model = next((e.client.served_model for e in self.engines if e.client.served_model), None)
        self._health = self._health or asyncio.create_task(self._check_forever())
        return self.models

    async def resolve_model(self, requested: str | None) -> str | None:
        return await self._any().client.resolve_model(requested)

    @property
    def streams_tokens(self) -> bool:
        return all(engine.client.streams_tokens for engine in self.engines)

    async def chat(self, chat_request: dict, session_id: str | None = None,
                   completion_id: str | None = None) -> UpstreamResult:
        result, moved_from = await self._on_session_engine(session_id, lambda c: c.chat(chat_request, session_id))
        result.metadata = {**result.metadata, **_moved(moved_from)}
        return result

    async def chat_stream(self, chat_request: dict, session_id: str | None = None,
                          completion_id: str | None = None) -> LiveChatStream:
        """Like `chat`; the engine's in-flight count covers opening the stream, not reading it."""
        stream, moved_from = await self._on_session_engine(
            session_id, lambda c: c.chat_stream(chat_request, session_id))
        stream.metadata = {**stream.metadata, **_moved(moved_from)}
        return stream

    async def _on_session_engine(self, session_id: str | None,
                                 call: Callable[[UpstreamClient], Awaitable[T]]) -> tuple[T, str | None]:
        """On the session's engine; when that engine cannot be reached the call goes once more, to the
        engine the session moves to (nothing was answered, so nobody saw a token of the first try)."""
        moves_left = 1
        while True:
            engine, moved_from = self._engine_for(session_id)
            engine.in_flight += 1
            engine.calls += 1
            try:
                return await call(engine.client), moved_from
            except UpstreamError as exc:
                exc.metadata = {**exc.metadata, **_moved(moved_from)}
                if not (self._taken_out(engine, exc) and moves_left):
                    raise
                moves_left -= 1
            finally:
                engine.in_flight -= 1

    async def tokenize(self, chat_request: dict) -> int:
        return await self._any().client.tokenize(chat_request)

    async def aclose(self) -> None:
        if self._health is not None:
            self._health.cancel()
        await asyncio.gather(*(engine.client.aclose() for engine in self.engines))

    def status(self) -> dict:
        """Per-engine counts for `GET /admin/status`."""
        return {engine.url: engine.to_json() for engine in self.engines}

    def _engine_for(self, session_id: str | None) -> tuple[Engine, str | None]:
        """The session's engine, or a new one (the least loaded healthy) and the one it left, if any."""
        placed = self.placed.get(session_id) if session_id else None
        if placed is not None and placed.healthy:
            return placed, None
        chosen = min(self._healthy(), key=lambda e: (e.in_flight, e.sessions))
        if session_id:
            chosen.sessions += 1
            self.placed[session_id] = chosen
        return chosen, placed.url if placed is not None else None

    def _taken_out(self, engine: Engine, exc: UpstreamError) -> bool:
        """Take an engine that cannot be reached out of service; True when another one can take over."""
        if exc.kind != "unreachable" or not any(e.healthy for e in self.engines if e is not engine):
            return False
        if engine.healthy:
            engine.healthy = False
            logger.warning("engine %s taken out of the pool: %s", engine.url, exc)
        return True

    def _healthy(self) -> list[Engine]:
        """The engines in service; when every one is out, all of them (a call then fails like with one)."""
        return [engine for engine in self.engines if engine.healthy] or self.engines

    def _any(self) -> Engine:
        return self._healthy()[0]

    async def _check_forever(self) -> None:
        while True:
            await asyncio.sleep(self.health_every)
            for engine in self.engines:
                if not engine.healthy and await engine.client.healthy():
                    engine.healthy = True
                    logger.warning("engine %s is back in the pool", engine.url)


def _moved(moved_from: str | None) -> dict:
    return {"engine_moved_from": moved_from} if moved_from else {}
