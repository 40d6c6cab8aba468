"""A client that stops reading its stream cannot hold the call, or a weight update, forever.

Four raw clients with a small receive buffer ask a paced engine for long streams and never read them:
within `--stream-stall` of their socket backing up, each stream is cut and its call recorded
`disconnected` with the tokens sampled so far, so a `finish` pause started meanwhile drains.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import live
import pytest

STALL = 2.0
TOKEN = "a-control-token-for-stall-tests"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
LONG = " ".join(["The quick brown fox jumps over the lazy dog, then it runs far away into the green forest."] * 60)
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
CLIENTS = 4


@pytest.fixture(scope="module")
def gw(tmp_path_factory) -> Iterator[live.GatewayProcess]:
    """A paced engine: a whole LONG reply streams for ~10 s, far longer than the stall."""
    root = tmp_path_factory.mktemp("stall")
    script = live.write_script(root / "script.jsonl", [{"content": LONG}])
    with live.start_gateway(root / "store", "--script", str(script), "--stream-stall", str(STALL),
                            "--control-token", TOKEN, env={"TRACETAP_ENGINE_PACE_MS": "8"}) as process:
        yield process


def unread_stream(port: int, session: str) -> socket.socket:
    """A client that asks for a stream and never reads it (its receive buffer holds 4 KiB)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nx-tracetap-session: {session}\r\n"
            f"Content-Length: {len(BODY)}\r\n\r\n")
    sock.sendall(head.encode() + BODY)
    return sock


def in_flight(gw: live.GatewayProcess) -> int:
    return httpx.get(f"{gw.url}/admin/status", headers=ADMIN, timeout=10).json()["in_flight"]


def wait_for(done, seconds: float) -> float:
    """Seconds until `done()` holds (AssertionError after `seconds`)."""
    start = time.monotonic()
    while not done():
        assert time.monotonic() - start < seconds
        time.sleep(0.1)
    return time.monotonic() - start


def test_streams_nobody_reads_are_cut_recorded_disconnected_and_a_finish_pause_drains(gw):
    sessions = [f"stalled-{i}" for i in range(CLIENTS)]
    clients = []
    try:
        clients = [unread_stream(gw.port, sid) for sid in sessions]
        wait_for(lambda: in_flight(gw) == CLIENTS, 60)
        assert httpx.post(f"{gw.url}/admin/pause", json={"in_flight": "finish"}, headers=ADMIN).status_code == 200
        drained = wait_for(lambda: in_flight(gw) == 0, 40)
    finally:
        httpx.post(f"{gw.url}/admin/resume", json={}, headers=ADMIN, timeout=10)
        for sock in clients:
            sock.close()
    rows = live.store_rows(gw.store, "session_id LIKE 'stalled-%'")
    assert [row["session_id"] for row in rows] == sessions, f"drained after {drained:.1f} s"
    for row in rows:
        assert (row["status"], row["finish_reason"]) == ("disconnected", None)
        assert row["error"] == f"the client read nothing of the stream for {STALL:g} s"
        sampled = row["completion_token_ids"]
        assert row["prompt_token_ids"] and sampled and len(row["logprobs"]) == len(sampled)
