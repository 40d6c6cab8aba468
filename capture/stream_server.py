"""A loopback HTTP server that sends streamed replies chunk by chunk.

A proxy addon answers with whole bodies (mitmproxy cannot stream a body an addon produces), so the
addon registers a `StreamReply` here under a one-use ticket and points the flow at this server; the
proxy then streams this server's response to the client as it comes. A ticket is 32 random bytes and
expires after TICKET_SECONDS unclaimed. When the proxy drops the connection (its client left), the
reply learns it (`LiveStream.disconnected`), which stops the upstream and records the call.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable

from tracetap.capture.streaming import StreamReply

logger = logging.getLogger("tracetap.gateway")
TICKET_BYTES = 32
TICKET_SECONDS = 30.0
FIRST_HEAD_SECONDS = 10.0  # to read the first request head of a connection (later ones: no limit)


class StreamServer:
    """Start and stop it inside the event loop that runs the replies."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tickets: dict[str, StreamReply] = {}
        self._serving: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening; replies never claimed and replies being sent end as disconnected."""
        if self._server is not None:
            self._server.close()
        for task in list(self._serving):
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
        """Requests on one kept-alive connection (the proxy reuses it for the next stream), until it closes."""
        task = asyncio.current_task()
        assert task is not None  # a handler of asyncio.start_server runs in its own task
        self._serving.add(task)
        try:
            early = b""
            timeout: float | None = FIRST_HEAD_SECONDS
            while (head := await _head(reader, early, timeout)) is not None:
                early, timeout = b"", None  # kept alive: it waits for the proxy's next request
                reply = self._tickets.pop(_ticket(head), None)
                if reply is None:
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                else:
                    early = await _send(reply, reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # the proxy went away, or this was no request of the proxy
        finally:
            writer.close()
            self._serving.discard(task)


async def _head(reader: asyncio.StreamReader, early: bytes, timeout: float | None) -> bytes | None:
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


async def _send(reply: StreamReply, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """Head, then each piece as an HTTP chunk as it is produced; a dropped connection is a disconnect.
    Returns the bytes of the proxy's next request the watch for a dropped connection read early."""
    lines = [f"HTTP/1.1 {reply.status} OK", *(f"{k}: {v}" for k, v in reply.headers.items()),
             "transfer-encoding: chunked"]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    sending = asyncio.ensure_future(_pump(reply, writer))
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


async def _pump(reply: StreamReply, writer: asyncio.StreamWriter) -> None:
    while (data := await reply.body.next()) is not None:
        if data:
            writer.write(b"%x\r\n%b\r\n" % (len(data), data))
            await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()
