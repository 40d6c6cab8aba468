"""A TCP forwarder the node owns: containers reach the node's loopback gateway through it.

It listens on the host side of a container network (the bridge's address) and copies bytes both ways to
the gateway on 127.0.0.1, so the gateway itself stays bound to loopback and a container never reaches
the host's loopback directly. Closing it ends every connection it carries.
"""

from __future__ import annotations

import asyncio
import contextlib

CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


class Forwarder:
    """`listen_host:port` (port chosen by the kernel) -> `target_host:target_port`."""

    def __init__(self, listen_host: str, target_host: str, target_port: int) -> None:
        self.listen_host, self.target_host, self.target_port = listen_host, target_host, target_port
        self.port: int | None = None
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._links.add(task)
        try:
            await self._link(reader, writer)
        finally:
            self._links.discard(task)

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            await _close(writer)
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            await asyncio.gather(_close(up_writer), _close(writer))

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._links):
            task.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None
