"""Live streams whose client stopped reading are cut.

A client that never reads its stream would hold its call forever: the bounded queue between the
upstream and the client (capture/streaming.py) fills, the upstream read waits, the call stays in flight,
and a `finish` pause (capture/fence.py) never drains. The client's socket shows it: what mitmproxy wrote
to it stays unsent (the kernel's send buffer is full) and stops shrinking. After `seconds` of that, the
call is recorded `disconnected` with what was sampled, and the client's connection is closed.

The sockets a live stream passes through keep at most SOCKET_BUFFER bytes each in the kernel (Linux
would let them grow to megabytes): the client's, and the proxy's end of its loopback connection to the
stream server (`limit_stream_socket`; the server sizes its own end). A client that stops reading then
backs up to the upstream after kilobytes, not after a whole reply, and what it leaves unread is bounded.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from mitmproxy.connection import Client, Server
from tracetap.capture.client_sockets import close_client, fix_buffer, unsent_bytes
from tracetap.capture.streaming import StreamReply, stalled

logger = logging.getLogger("tracetap.gateway")
STALL_SECONDS = 60.0
SOCKET_BUFFER = 64 * 1024  # bytes (the kernel doubles it for its bookkeeping)


class StallWatch:
    """One watch per live stream, on the gateway's event loop."""

    def __init__(self, seconds: float = STALL_SECONDS) -> None:
        self.seconds = seconds
        self.tick = min(1.0, seconds / 4)  # how often a stream's unsent bytes are looked at
        self._watches: dict[str, asyncio.Task] = {}  # flow id -> its watch

    def watch(self, flow_id: str, client: Client, reply: StreamReply) -> None:
        fix_buffer(client.id, client, socket.SO_SNDBUF, SOCKET_BUFFER)
        task = asyncio.create_task(self._watch(client, reply))
        self._watches[flow_id] = task
        task.add_done_callback(lambda _: self._watches.pop(flow_id, None))

    def limit_stream_socket(self, client_id: str, server: Server) -> None:
        """The proxy's end of a connection it opened to the stream server for this client."""
        fix_buffer(client_id, server, socket.SO_RCVBUF, SOCKET_BUFFER)

    def stop(self, flow_id: str) -> None:
        """The stream ended (its response or error hook ran)."""
        if (task := self._watches.pop(flow_id, None)) is not None:
            task.cancel()

    async def close(self) -> None:
        tasks = list(self._watches.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self, client: Client, reply: StreamReply) -> None:
        """Progress is an empty or shrinking write buffer; `seconds` without it is a stall."""
        clock = asyncio.get_running_loop().time
        since, last = clock(), 0
        while (unsent := unsent_bytes(client)) is not None:
            if unsent == 0 or unsent < last:
                since = clock()
            elif clock() - since >= self.seconds:
                return await self._cut(client, reply)
            last = unsent
            await asyncio.sleep(self.tick)

    async def _cut(self, client: Client, reply: StreamReply) -> None:
        logger.warning("cut a stream whose client read nothing for %g s (%s)", self.seconds,
                       reply.headers.get("x-tracetap-completion-id", "?"))
        await reply.body.disconnected(stalled(self.seconds))
        close_client(client, "the client stopped reading its stream")
