"""A loopback HTTP server that sends streamed replies chunk by chunk.

A proxy addon answers with whole bodies (mitmproxy cannot stream a body an addon produces), so the
addon registers a `StreamReply` here under a one-use ticket and points the flow at this server; the
proxy then streams this server's response to the client as it comes. A ticket is 32 random bytes and
expires after TICKET_SECONDS unclaimed. When the proxy drops the connection (its client left), the
reply learns it (`LiveStream.disconnected`), which stops the upstream and records the call.

The reply is framed the way the client asked: chunked for HTTP/1.1; for HTTP/1.0 (which has no chunked
coding) unframed, ending with the connection; and the connection closed after it when the request said
`Connection: close` (the proxy passes both on, and ends its client connection the same way).

Any local process can connect here, so the server is bounded like the main port: each request head
must arrive within `timeouts.head`, a kept-alive connection waits `timeouts.idle` for its next request,
a request without a valid ticket gets a 404 and the connection closed, and at most `max_pending`
connections may be waiting to show a ticket (a new one closes the oldest: the proxy's own connections
show theirs at once). Its sockets send through a small fixed kernel buffer (capture/stalls.py).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass

from tracetap.capture.descriptors import MAX_PENDING_STREAMS
from tracetap.capture.stalls import SOCKET_BUFFER
from tracetap.capture.streaming import StreamReply

logger = logging.getLogger("tracetap.gateway")
TICKET_BYTES = 32
TICKET_SECONDS = 30.0
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


@dataclass(frozen=True)
class Timeouts:
    head: float = 30.0  # seconds to read a connection's first request head
    idle: float = 180.0  # seconds a kept-alive connection waits for its next request


@dataclass(frozen=True)
class Framing:
    """How a reply is sent: as HTTP chunks (else raw, ending with the connection), and whether the
    connection stays open for the proxy's next request."""

    chunked: bool
    keep_alive: bool


class StreamServer:
    """Start and stop it inside the event loop that runs the replies."""

    def __init__(self, host: str = "127.0.0.1", timeouts: Timeouts = Timeouts(),
                 max_pending: int = MAX_PENDING_STREAMS) -> None:
        self.host = host
        self.port = 0
        self.timeouts = timeouts
        self.max_pending = max_pending
        self._server: asyncio.Server | None = None
        self._tickets: dict[str, StreamReply] = {}
        self._serving: set[asyncio.Task] = set()  # ticket expiries, and connections being served (with their writer)
        self._writers: dict[asyncio.Task, asyncio.StreamWriter] = {}
        self._pending: OrderedDict[asyncio.Task, None] = OrderedDict()  # connections yet to show a ticket

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening; replies never claimed and replies being sent end as disconnected. Connections
        are closed rather than their tasks cancelled: asyncio 3.11 logs a traceback for every cancelled
        connection handler."""
        if self._server is not None:
            self._server.close()
        for task in list(self._serving):
            if (writer := self._writers.get(task)) is not None:
                writer.close()
            else:
                task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)
        for ticket in list(self._tickets):
            await self._expire(ticket)

    def register(self, reply: StreamReply) -> str:
        """The path that claims `reply`, once, within TICKET_SECONDS."""
        ticket = secrets.token_hex(TICKET_BYTES)
        self._tickets[ticket] = reply
        asyncio.get_running_loop().call_later(TICKET_SECONDS, lambda: self._in_background(self._expire(ticket)))
        return "/" + ticket

    def _in_background(self, work: Awaitable[None]) -> None:
        """Run `work` as a task that `stop` waits for."""
        task = asyncio.ensure_future(work)
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    async def _expire(self, ticket: str) -> None:
        reply = self._tickets.pop(ticket, None)
        if reply is not None:
            await reply.body.disconnected()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # a handler of asyncio.start_server runs in its own task
        self._serving.add(task)
        self._writers[task] = writer
        self._admit(task)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        try:
            await self._requests(task, reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # the proxy went away, or this was no request of the proxy
        finally:
            writer.close()
            self._serving.discard(task)
            self._writers.pop(task, None)
            self._pending.pop(task, None)

    def _admit(self, task: asyncio.Task) -> None:
        """Count a new connection as waiting for its ticket; over the cap, the oldest waiting one is closed
        (its task then ends at the end of its input)."""
        if len(self._pending) >= self.max_pending:
            oldest, _ = self._pending.popitem(last=False)
            self._writers[oldest].close()
        self._pending[task] = None

    async def _requests(self, task: asyncio.Task, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Requests on one connection (the proxy keeps it alive for its client's next stream), until it
        closes, asks to close, times out or names no ticket."""
        early, timeout = b"", self.timeouts.head
        while (head := await _head(reader, early, timeout)) is not None:
            reply = self._tickets.pop(_ticket(head), None)
            if reply is None:
                writer.write(NOT_FOUND)
                return
            self._pending.pop(task, None)
            framing = _framing(head)
            early = await _send(reply, reader, writer, framing)
            if not framing.keep_alive:
                return
            timeout = self.timeouts.idle


async def _head(reader: asyncio.StreamReader, early: bytes, timeout: float) -> bytes | None:
    """The next request head (`early`: its first bytes, already read); None when the connection ends."""
    if b"\r\n\r\n" in early:
        return early
    try:
        return early + await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    except asyncio.IncompleteReadError as exc:
        if exc.partial or early:
            raise
        return None


def _ticket(head: bytes) -> str:
    """The ticket of `GET /<ticket> HTTP/1.1`."""
    target = head.split(b"\r\n", 1)[0].split(b" ")
    return target[1].decode("latin-1").lstrip("/") if len(target) == 3 else ""


def _framing(head: bytes) -> Framing:
    """HTTP/1.0 gets no chunks and no keep-alive (its body ends with the connection); `Connection: close`
    ends the connection after the reply."""
    request_line, *fields = head.rstrip(b"\r\n").split(b"\r\n")
    http10 = request_line.endswith(b" HTTP/1.0")
    closing = any(_asks_to_close(field) for field in fields)
    return Framing(chunked=not http10, keep_alive=not (http10 or closing))


def _asks_to_close(field: bytes) -> bool:
    name, _, value = field.partition(b":")
    return name.strip().lower() == b"connection" and b"close" in (t.strip() for t in value.lower().split(b","))


async def _send(reply: StreamReply, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                framing: Framing) -> bytes:
    """Head, then each piece as it is produced; a dropped connection is a disconnect. Returns the bytes
    of the proxy's next request the watch for a dropped connection read early."""
    writer.write(_response_head(reply, framing))
    sending = asyncio.ensure_future(_pump(reply, writer, framing.chunked))
    gone = asyncio.ensure_future(reader.read(1))  # EOF: the proxy closed the connection
    try:
        await asyncio.wait({sending, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)  # its read must end before the next one starts
        if not sending.done():
            sending.cancel()
            await asyncio.gather(sending, return_exceptions=True)
            await reply.body.disconnected()
        elif sending.exception() is not None:
            logger.debug("stream to the proxy failed: %r", sending.exception())
            await reply.body.disconnected()
    if sending.cancelled() or sending.exception() is not None:
        raise ConnectionResetError("the proxy dropped the stream")
    return b"" if gone.cancelled() else gone.result()


def _response_head(reply: StreamReply, framing: Framing) -> bytes:
    lines = [f"HTTP/1.1 {reply.status} OK", *(f"{k}: {v}" for k, v in reply.headers.items())]
    if framing.chunked:
        lines.append("transfer-encoding: chunked")
    if not framing.keep_alive:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _pump(reply: StreamReply, writer: asyncio.StreamWriter, chunked: bool) -> None:
    while (data := await reply.body.next()) is not None:
        if data:
            writer.write(b"%x\r\n%b\r\n" % (len(data), data) if chunked else data)
            await writer.drain()
    if chunked:
        writer.write(b"0\r\n\r\n")
    await writer.drain()
