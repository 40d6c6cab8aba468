"""The sockets behind mitmproxy's connection handlers (mitmproxy 11.0.2 is pinned).

An addon sees a client connection, and the server connections mitmproxy opens for it, as data
(`mitmproxy.connection.Client`, `Server`); closing one, asking how much of what was written to it is
still unsent, or sizing its kernel buffers needs the handler that owns the sockets.
`Proxyserver.connections` maps a client's id to that handler.
"""

from __future__ import annotations

import asyncio
import socket

from mitmproxy import ctx
from mitmproxy.connection import Client, Connection
from mitmproxy.proxy.server import ConnectionHandler


def close_client(client: Client, reason: str) -> None:
    """End a client connection the way mitmproxy's own idle timeout does: cancel its handler task (or,
    while its `client_connected` hooks still run, mark it so mitmproxy closes it after them)."""
    handler = _handler(client.id)
    io = handler.transports.get(client) if handler is not None else None
    if io is not None and io.handler is not None:
        io.handler.cancel(reason)
    else:
        client.error = reason


def unsent_bytes(client: Client) -> int | None:
    """Bytes written to a client that its socket has not accepted yet (the kernel's send buffer is full:
    the client is not reading); None when the connection is gone."""
    writer = _writer(client.id, client)
    return None if writer is None else writer.transport.get_write_buffer_size()


def fix_buffer(client_id: str, connection: Connection, option: int, size: int) -> None:
    """Fix a kernel buffer (SO_SNDBUF or SO_RCVBUF) of a socket of this client's handler at `size` bytes:
    no more autotuning, which lets a socket buffer megabytes."""
    writer = _writer(client_id, connection)
    if writer is not None and (sock := writer.get_extra_info("socket")) is not None:
        sock.setsockopt(socket.SOL_SOCKET, option, size)


def _writer(client_id: str, connection: Connection) -> asyncio.StreamWriter | None:
    handler = _handler(client_id)
    io = handler.transports.get(connection) if handler is not None else None
    writer = io.writer if io is not None else None
    return writer if isinstance(writer, asyncio.StreamWriter) and not writer.is_closing() else None


def _handler(client_id: str) -> ConnectionHandler | None:
    return ctx.master.addons.get("proxyserver").connections.get(client_id)
