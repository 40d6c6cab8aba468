"""The gateway process's file-descriptor budget.

Every connection, store file and upstream socket takes a descriptor, and a process out of them fails
everywhere at once: accept() loops on EMFILE, upstream calls and store writes fail. So the soft
RLIMIT_NOFILE is raised to the hard limit at start, and the connection caps are derived from what it
allows, leaving a reserve for everything that is not a client connection.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

RESERVED = 512  # the store's files, the upstream pool, the embedded engine, logs
PER_CONNECTION = 4  # a client in a live stream holds its socket, both ends of the loopback stream, an upstream
MAX_PENDING_STREAMS = 1024  # stream-server connections that have not shown a ticket yet (see stream_server.py)


@dataclass(frozen=True)
class Budget:
    """What the descriptor limit allows: client connections on the main port, and stream-server
    connections that have not yet shown a ticket."""

    limit: int
    max_connections: int
    max_pending_streams: int


def raise_soft_limit() -> int:
    """The soft RLIMIT_NOFILE raised to the hard limit where the system allows it; the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft
        return hard
    return soft


def budget(limit: int, max_connections: int = 0) -> Budget:
    """The caps under `limit` descriptors; `max_connections` (when > 0) overrides the derived one."""
    reserved = min(RESERVED, limit // 4)
    pending = max(8, min(MAX_PENDING_STREAMS, limit // 16))
    derived = max(8, (limit - reserved - pending) // PER_CONNECTION)
    return Budget(limit, max_connections or derived, pending)
