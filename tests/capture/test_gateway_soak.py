"""Soak (marker `soak`, run by scripts/test.sh): thousands of calls over thousands of sessions,
good and bad mixed, against one real gateway process; its RSS stays flat once warmed up."""

from __future__ import annotations

import gzip
import json
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx
import live
import pytest

pytestmark = pytest.mark.soak

# Half the calls open a session: past WARM_UP the writer's session cache (1024) is full, so from
# there on every per-session structure is at its cap and RSS must stay put. RSS also steps up once by a
# few MiB at a different call from run to run (an allocator arena or pool being touched for the first
# time), so the check is for a leak: growth in each of two windows of WINDOW calls after the warm-up, and
# a leak grows in both where a one-off step lands in one.
WARM_UP, WINDOW = 2500, 2500
TOTAL = WARM_UP + 2 * WINDOW
MAX_GROWTH_KIB = 1536  # per window; measured: ~0.3-0.8 MiB; with an uncapped session map ~3 MiB
ARENAS = {"MALLOC_ARENA_MAX": "2"}  # no per-thread arena per new executor worker: fewer one-off steps
CHAT = "/v1/chat/completions"
GOOD = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC = {"model": "claude", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
BOMB = gzip.compress(bytes(4 << 20))  # 4 KiB that inflate to 4 MiB: refused for its ratio


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def raw(port: int, request: bytes) -> None:
    """A malformed request over a raw socket; the gateway answers and closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        while sock.recv(65536):
            pass


def calls(port: int) -> list[Callable[[httpx.Client, int], int | None]]:
    """Ten kinds of call, one per request number modulo 10; most open a new session."""
    def chat(c: httpx.Client, n: int) -> int:
        return c.post(CHAT, json=GOOD, headers={"x-tracetap-session": f"soak-{n}"}).status_code

    def gzipped(c: httpx.Client, n: int) -> int:
        body = gzip.compress(json.dumps(GOOD).encode())
        return c.post(f"/s/gz-{n}{CHAT}", content=body, headers={"content-encoding": "gzip"}).status_code

    def keyed(c: httpx.Client, n: int) -> int:
        headers = {"x-api-key": f"sk-tap-soak-{n}", "anthropic-version": "2023-06-01"}
        return c.post("/v1/messages", json=ANTHROPIC, headers=headers).status_code

    def hashed(c: httpx.Client, n: int) -> int:
        return c.post(CHAT, json=GOOD, headers={"authorization": f"Bearer some-key-{n}"}).status_code

    return [
        chat, chat, gzipped, keyed, hashed,
        lambda c, n: c.post(CHAT, content=b'{"model": "m", "messages": [', headers={"x-session-id": f"b{n}"})
        .status_code,
        lambda c, n: c.post(f"{CHAT}?session_id=bad%20{n}", json=GOOD).status_code,
        lambda c, n: c.head(f"/nothing-{n}").status_code,
        lambda c, n: c.post(CHAT, content=BOMB, headers={"content-encoding": "gzip"})
        .status_code,
        lambda c, n: raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 1\r\n"
                               b"Content-Length: 2\r\n\r\nab"),
    ]


EXPECTED = [200, 200, 200, 200, 200, 400, 400, 404, 413, None]


@pytest.fixture(scope="module")
def gw(tracetap_home):
    shm = Path("/dev/shm")  # many small durable writes: a memory-backed store keeps the run short
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as root:
        with live.StubUpstream() as stub:
            stub.requests = _Discard()
            with live.start_gateway(Path(root) / "store", "--upstream", stub.url, env=ARENAS) as process:
                yield process


class _Discard(list):
    """The stub keeps every request it gets; a soak must not measure the test's own memory."""

    def append(self, item: object) -> None:
        pass


def test_rss_is_flat_after_warm_up(gw):
    kinds = calls(gw.port)
    marks = (WARM_UP, WARM_UP + WINDOW, TOTAL)
    samples = {}
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        for n in range(TOTAL):
            assert kinds[n % 10](client, n) == EXPECTED[n % 10], f"call {n}"
            if n + 1 in marks:
                samples[n + 1] = rss_kib(gw.process.pid)
    growths = [samples[end] - samples[start] for start, end in zip(marks, marks[1:], strict=False)]
    print(f"gateway RSS (KiB) after {marks} calls: {[samples[mark] for mark in marks]}")
    assert min(growths) < MAX_GROWTH_KIB, f"RSS grew {growths} KiB in each window of {WINDOW} calls"
    assert len(live.store_rows(gw.store, "status = 'ok'")) == TOTAL // 2
