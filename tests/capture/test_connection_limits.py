"""Bounded by construction: the gateway under connections that never finish a request.

From helper processes (flood.py), 5,000 connections send half a request head to the main port and 5,000
more sit silent on the stream server's port: a legitimate call (the official OpenAI SDK, whole and
streamed) still succeeds in its usual time, the gateway's descriptors stay within its budget (the
connection cap, the stream server's waiting connections, the reserve), its log gains a few lines, and
once the head timeout passes every flood connection is closed. A silent connection, a half-sent body, an
idle kept-alive connection and a bogus request to the stream server are each closed in their time. At
the cap, with every connection busy, new ones are refused, summarized in one log line.
"""

from __future__ import annotations

import re
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import live
import openai
import pytest
from proc_info import fd_limit, listening_ports, open_fds
from tracetap.capture import descriptors

REPLY = "Bounded by construction."
TOKEN = "a-control-token-for-limit-tests"
HEAD_TIMEOUT = 4.0
IDLE_TIMEOUT = 6.0
CAP = 3000
FLOOD = 5000
HALF_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: appli"
USER = [{"role": "user", "content": "hi"}]
FLOOD_SCRIPT = Path(__file__).with_name("flood.py")


@pytest.fixture(scope="module")
def gw(tmp_path_factory) -> Iterator[live.GatewayProcess]:
    root = tmp_path_factory.mktemp("limits")
    with live.scripted_gateway(root, [{"content": REPLY}], "--head-timeout", str(HEAD_TIMEOUT), "--idle-timeout",
                               str(IDLE_TIMEOUT), "--max-connections", str(CAP), "--control-token", TOKEN) as process:
        yield process


@dataclass
class Flood:
    """A helper process holding connections: `opened` of them connected."""

    process: subprocess.Popen
    opened: int

    def closed(self) -> int:
        """How many the gateway has closed."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline().split()[1])


@contextmanager
def flood(port: int, payload: bytes = b"") -> Iterator[Flood]:
    """FLOOD connections to `port`, each sending `payload`, from a helper process killed on exit."""
    process = subprocess.Popen([sys.executable, str(FLOOD_SCRIPT), str(port), str(FLOOD), payload.hex()],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield Flood(process, int(process.stdout.readline().split()[1]))
    finally:
        process.kill()
        process.wait()


@contextmanager
def peak_fds(pid: int) -> Iterator[list[int]]:
    """The most descriptors `pid` held, sampled every 50 ms while the block runs (in the list, after it)."""
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], open_fds(pid))

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        yield peak
    finally:
        done.set()
        thread.join()


def stream_server_port(gw: live.GatewayProcess) -> int:
    """The gateway's third listening port: neither its own nor its embedded engine's."""
    engine = int(re.search(r"upstream http://127\.0\.0\.1:(\d+)", gw.log()).group(1))
    [port] = listening_ports(gw.process.pid) - {gw.port, engine}
    return port


def legitimate_calls(gw: live.GatewayProcess, key: str) -> float:
    """Seconds a whole and a streamed call of the official OpenAI SDK take; both must be answered in full."""
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0, timeout=30)
    start = time.monotonic()
    assert client.chat.completions.create(model="m", messages=USER).choices[0].message.content == REPLY
    stream = client.chat.completions.create(model="m", messages=USER, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == REPLY
    return time.monotonic() - start


def wait_until(done: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


def test_floods_of_unfinished_connections_leave_a_legitimate_call_its_usual_time(gw):
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < FLOOD + 100:
        pytest.skip("the hard descriptor limit is below what one flood process holds")
    usual = legitimate_calls(gw, "sk-limits-before")
    allowed = CAP + descriptors.budget(fd_limit(gw.process.pid), CAP).max_pending_streams + descriptors.RESERVED
    logged = len(gw.log().splitlines())
    with peak_fds(gw.process.pid) as peak, flood(gw.port, HALF_HEAD) as heads, \
            flood(stream_server_port(gw)) as silent:
        assert (heads.opened, silent.opened) == (FLOOD, FLOOD)
        took = legitimate_calls(gw, "sk-limits-during")
        closed = wait_until(lambda: (heads.closed(), silent.closed()) == (FLOOD, FLOOD), HEAD_TIMEOUT + 20)
        left = (heads.closed(), silent.closed())
    assert took < usual + 5.0, f"{took:.2f} s under the floods, {usual:.2f} s before"
    assert peak[0] <= allowed < fd_limit(gw.process.pid), f"{peak[0]} descriptors at most, budget {allowed}"
    assert closed, f"the gateway closed only {left} of the {FLOOD} + {FLOOD} flood connections"
    added = gw.log().splitlines()[logged:]
    assert len(added) <= 10 and "Traceback" not in "\n".join(added), added
    assert legitimate_calls(gw, "sk-limits-after") < usual + 5.0


def closed_after(port: int, payload: bytes, limit: float = 30.0) -> tuple[float, bytes]:
    """Send `payload`; the seconds until the gateway closes the connection, and what it sent before."""
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as sock:
        sock.sendall(payload)
        start, answer = time.monotonic(), b""
        try:
            while data := sock.recv(65536):
                answer += data
        except ConnectionResetError:
            pass  # closed with our request unread: a refusal
        return time.monotonic() - start, answer


@pytest.mark.parametrize(("payload", "timeout"), [
    (b"", HEAD_TIMEOUT),
    (HALF_HEAD, HEAD_TIMEOUT),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n{", IDLE_TIMEOUT),
    (b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n", IDLE_TIMEOUT),
], ids=["silent", "half-head", "half-body", "kept-alive"])
def test_a_connection_not_sending_its_request_is_closed_in_its_time(gw, payload, timeout):
    took, _ = closed_after(gw.port, payload)
    assert timeout - 0.5 < took < timeout + 3, f"closed after {took:.2f} s, timeout {timeout} s"


def test_the_stream_server_closes_a_bogus_request_at_once_and_a_silent_connection_in_time(gw):
    port = stream_server_port(gw)
    took, answer = closed_after(port, b"GET /not-a-ticket HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 404 ") and took < 1.0
    took, _ = closed_after(port, b"")
    assert HEAD_TIMEOUT - 0.5 < took < HEAD_TIMEOUT + 3


SLOW_REPLY = " ".join(["A slow reply, a token at a time."] * 8)


def stream_slowly(url: str, key: str, started: threading.Event, texts: list[str]) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)
    pieces = []
    for chunk in client.chat.completions.create(model="m", messages=USER, stream=True):
        started.set()
        pieces.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    texts.append("".join(pieces))


def test_at_the_cap_with_every_connection_busy_new_ones_are_refused_in_one_log_line(tmp_path):
    script = live.write_script(tmp_path / "script.jsonl", [{"content": SLOW_REPLY}])
    with live.start_gateway(tmp_path / "store", "--script", str(script), "--max-connections", "4",
                            "--control-token", TOKEN, env={"TRACETAP_ENGINE_PACE_MS": "60"}) as gw:
        started, texts = [threading.Event() for _ in range(4)], []
        threads = [threading.Thread(target=stream_slowly, args=(gw.url, f"sk-busy-{i}", started[i], texts))
                   for i in range(4)]
        for thread in threads:
            thread.start()
        try:
            assert all(event.wait(60) for event in started)
            refused = [closed_after(gw.port, b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n", 5) for _ in range(20)]
        finally:
            for thread in threads:
                thread.join(60)
        assert texts == [SLOW_REPLY] * 4
        assert all(took < 1.0 and answer == b"" for took, answer in refused), refused
        assert httpx.get(f"{gw.url}/v1/models", timeout=10).status_code == 200  # room again
    summaries = re.findall(r"at the connection cap \(4, --max-connections\): refused (\d+)", gw.log())
    assert 1 <= len(summaries) <= 2 and sum(map(int, summaries)) == 20, gw.log()[-2000:]
