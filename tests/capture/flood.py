"""Hold thousands of loopback connections to one port, for the connection-limit tests, in a process of its
own (its descriptor limit raised to the hard limit; the test process keeps its own).

    python flood.py PORT COUNT PAYLOAD_HEX

Connects COUNT sockets (at a steady rate, not one after another), sends PAYLOAD on each, prints `open N` (the
number connected), then answers every line on stdin with `closed N`: how many the server has closed
since. Exits, closing them all, at the end of stdin.
"""

from __future__ import annotations

import resource
import selectors
import socket
import sys
import time

CONNECT_SECONDS = 60.0
RATE = 1000  # connects a second: a listener's accept queue holds 100, and a connect dropped from a full queue
# is retried by the kernel only a second later (and may look established to the client meanwhile)
BATCH = 25


def connect_all(port: int, count: int) -> list[socket.socket]:
    """`count` connections, started at RATE a second, then waited for."""
    selector, start = selectors.DefaultSelector(), time.monotonic()
    for index in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        selector.register(sock, selectors.EVENT_WRITE)
        if index % BATCH == BATCH - 1:
            time.sleep(max(0.0, start + index / RATE - time.monotonic()))
    return wait_connected(selector, start + CONNECT_SECONDS)


def wait_connected(selector: selectors.BaseSelector, deadline: float) -> list[socket.socket]:
    connected = []
    while selector.get_map() and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=1.0):
            selector.unregister(key.fileobj)
            if key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                connected.append(key.fileobj)
    return connected


def closed(socks: list[socket.socket]) -> int:
    """How many of `socks` the server closed (end of stream or reset; nothing else is ever sent)."""
    count = 0
    for sock in socks:
        try:
            count += sock.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            count += 1
    return count


def main(port: int, count: int, payload: bytes) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    socks = connect_all(port, count)
    for sock in socks:
        try:
            sock.send(payload)
        except OSError:
            pass  # closed already: counted by `closed`
    print(f"open {len(socks)}", flush=True)
    for _ in sys.stdin:
        print(f"closed {closed(socks)}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), bytes.fromhex(sys.argv[3]))
