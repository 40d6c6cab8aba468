"""One streamed generation call, live: upstream chunks become the API's events as they arrive, and the
answer is recorded durably before its terminal events are sent.

Between the upstream and the client sits a bounded queue (QUEUE_CHUNKS chunks): the upstream reader
runs ahead of a slow client by at most that much, then waits, so memory stays bounded whatever the
client does. The reader runs under the gateway's fence, so a pause that aborts calls in flight stops
it. How the call ends decides what is recorded and sent (`Ending`): ok (terminal events once durable),
an upstream failure or a pause abort (partial tokens recorded, an in-stream error sent), or a client
that went away or stopped reading (partial tokens recorded as `disconnected`, nothing sent).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from tracetap.capture.adapters.base import StreamTranslator
from tracetap.capture.fence import Aborted, Fence
from tracetap.capture.upstream import ChatStream, UpstreamError, UpstreamResult

QUEUE_CHUNKS = 64


@dataclass(frozen=True)
class Ending:
    """How a streamed call ended: the status recorded, and the in-stream error sent (None: none sent)."""

    status: str  # ok | upstream_error | timeout | aborted | disconnected
    http_status: int = 200
    error: str | None = None
    kind: str = "upstream_error"  # the error kind of the in-stream error (capture/adapters/base.py ERROR_KINDS)


DISCONNECTED = Ending("disconnected", 200, "the client disconnected mid-stream")


def stalled(seconds: float) -> Ending:
    """A client that stopped reading its stream is recorded like one that left (capture/stalls.py)."""
    return Ending("disconnected", 200, f"the client read nothing of the stream for {seconds:g} s")


# records the call (its folded answer, or why it is unusable); raises when the record could not be written
Record = Callable[[UpstreamResult | UpstreamError, Ending], Awaitable[None]]


@dataclass
class StreamReply:
    """A reply whose body is produced while the upstream generates (beside capture/service.py `Reply`)."""

    status: int
    headers: dict[str, str]
    body: LiveStream = field(repr=False)


class LiveStream:
    """The body of a StreamReply: `next()` gives event bytes until None; `disconnected()` when the client
    went away first. Create it inside the gateway's event loop (the upstream reader starts at once)."""

    def __init__(self, upstream: ChatStream, translator: StreamTranslator, record: Record, fence: Fence):
        self.upstream, self.translator, self.record = upstream, translator, record
        self._queue: asyncio.Queue[dict | Ending] = asyncio.Queue(QUEUE_CHUNKS)
        self._reader = asyncio.create_task(self._read(fence))
        self._events = self._generate()
        self._recording: asyncio.Task | None = None  # once started, the call's one record is being written

    async def next(self) -> bytes | None:
        return await anext(self._events, None)

    async def disconnected(self, ending: Ending = DISCONNECTED) -> None:
        """Stop the upstream (the engine aborts the request) and record what was sampled so far (once:
        a later call waits for that record)."""
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self.upstream.aclose()
        if self._recording is None:
            self._recording = asyncio.ensure_future(self.record(self._result(), ending))
        await asyncio.gather(self._recording, return_exceptions=True)  # a failed write is logged where it failed

    async def _read(self, fence: Fence) -> None:
        """Upstream chunks into the queue, then how the upstream ended."""
        try:
            await fence.upstream(self._pump())
            ending = Ending("ok")
        except UpstreamError as exc:
            ending = _failed(exc)
        except Aborted as exc:
            ending = Ending("aborted", 503, str(exc), "unavailable")
        finally:
            await self.upstream.aclose()
        await self._queue.put(ending)

    async def _pump(self) -> None:
        async for chunk in self.upstream:
            await self._queue.put(chunk)

    async def _generate(self) -> AsyncIterator[bytes]:
        item = await self._queue.get()
        while isinstance(item, dict):
            if events := self.translator.events(item):
                yield b"".join(events)
            item = await self._queue.get()
        result = self._result()
        ending = _failed(result) if isinstance(result, UpstreamError) else item
        if isinstance(result, UpstreamResult) and ending.status == "ok":
            yield b"".join(self.translator.closing(result.body))
        yield b"".join(await self._ended(result, ending))

    async def _ended(self, result: UpstreamResult | UpstreamError, ending: Ending) -> list[bytes]:
        """Recorded, then the terminal events (or the in-stream error the ending calls for)."""
        try:
            await self._record(result, ending)
        except Exception:
            return self.translator.error(500, "the gateway could not record this call", "internal")
        if isinstance(result, UpstreamResult) and ending.status == "ok":
            return self.translator.terminal(result.body)
        return self.translator.error(ending.http_status, ending.error or ending.status, ending.kind)

    async def _record(self, result: UpstreamResult | UpstreamError, ending: Ending) -> None:
        """The one record of this call, written even when the client leaves while it is being written."""
        self._recording = asyncio.ensure_future(self.record(result, ending))
        await asyncio.shield(self._recording)

    def _result(self) -> UpstreamResult | UpstreamError:
        """The folded answer so far, or why its token fields cannot be stored."""
        try:
            return self.upstream.result()
        except UpstreamError as exc:
            return exc


def _failed(exc: UpstreamError) -> Ending:
    return Ending(exc.recorded_status, exc.status, str(exc), exc.reply_kind)


class Collected:
    """A streamed upstream call read whole, its stream kept: a call cut short still has its tokens."""

    def __init__(self) -> None:
        self.stream: ChatStream | None = None

    async def read(self, opening: Awaitable[ChatStream]) -> UpstreamResult:
        self.stream = await opening
        try:
            async for _ in self.stream:
                pass
        finally:
            await self.stream.aclose()
        return self.stream.result()

    def partial(self) -> UpstreamResult | None:
        """What was sampled before the read stopped (None: nothing was opened, or nothing usable)."""
        if self.stream is None:
            return None
        try:
            return self.stream.result()
        except UpstreamError:
            return None
