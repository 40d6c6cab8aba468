"""A byte forwarder the node owns: containers reach the node's loopback gateway through it.

For docker it listens on the host side of a container network (the bridge's address) and copies bytes
both ways to the gateway on 127.0.0.1, so the gateway itself stays bound to loopback and a container never
reaches the host's loopback directly. For rootless podman (containers without a network) it listens on a
unix socket shared into the containers, and a second copy of this file, run by the container's python3
(`python3 forward.py 127.0.0.1:PORT /path/gateway.sock`), gives the harness a TCP address on its own
loopback. So it uses the standard library only. Closing it ends every connection it carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass

CHUNK = 64 * 1024


@dataclass(frozen=True)
class Endpoint:
    """`host:port` (port 0: chosen by the kernel), or a unix socket `path`."""

    host: str = ""
    port: int = 0
    path: str = ""

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """`HOST:PORT`, or an absolute path for a unix socket."""
        if text.startswith("/"):
            return cls(path=text)
        host, _, port = text.rpartition(":")
        return cls(host=host, port=int(port))

    async def serve(self, accept) -> asyncio.Server:
        if self.path:
            return await asyncio.start_unix_server(accept, self.path)
        return await asyncio.start_server(accept, self.host, self.port)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.path:
            return await asyncio.open_unix_connection(self.path)
        return await asyncio.open_connection(self.host, self.port)


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
    """`listen` -> `target`; `start` returns the port listened on (0 for a unix socket)."""

    def __init__(self, listen: Endpoint, target: Endpoint) -> None:
        self.listen, self.target = listen, target
        self.port: int | None = None
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task] = set()

    async def start(self) -> int:
        self._server = await self.listen.serve(self._accept)
        self.port = 0 if self.listen.path else self._server.sockets[0].getsockname()[1]
        return self.port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio runs each connection's callback as a task
        self._links.add(task)
        try:
            await self._link(reader, writer)
        finally:
            self._links.discard(task)

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await self.target.connect()
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


async def _serve_forever(listen: Endpoint, target: Endpoint) -> None:
    forwarder = Forwarder(listen, target)
    await forwarder.start()
    assert forwarder._server is not None  # start() made it
    await forwarder._server.serve_forever()


if __name__ == "__main__":  # inside a container: python3 forward.py LISTEN TARGET
    asyncio.run(_serve_forever(Endpoint.parse(sys.argv[1]), Endpoint.parse(sys.argv[2])))
