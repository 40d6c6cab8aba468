"""The gateway's HTTP edges, over raw sockets against a real gateway process: oversized and
compressed bodies are refused with a 413 in the caller's API shape while memory stays near the limit,
HEAD answers carry no body, trailers do not hang, and malformed framing (a head over 64 KiB too) gets an
error in the caller's API shape, not HTML.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
from pathlib import Path

import h11
import httpx
import live
import pytest

MiB = 1 << 20
LIMIT = 16 * MiB
GOOD = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
OPENAI_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def stub():
    with live.StubUpstream() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def gw(stub, tmp_path_factory, tracetap_home):
    store = tmp_path_factory.mktemp("edges") / "store"
    with live.start_gateway(store, "--upstream", stub.url, "--max-body", str(LIMIT)) as process:
        assert httpx.post(f"{process.url}/v1/chat/completions", content=GOOD).status_code == 200  # warm up
        yield process


def memory_kib(pid: int) -> dict[str, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {name: int(fields[name].split()[0]) for name in ("VmRSS", "VmHWM")}


def reset_peak(pid: int) -> None:
    """Linux: writing 5 to clear_refs sets the peak (VmHWM) back to the current RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def exchange(port: int, head: bytes, body_parts=(), timeout: float = 20.0) -> bytes:
    """Send a request head and body parts the way a client that does not wait would, then read
    everything the gateway sends until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head)
        try:
            for part in body_parts:
                sock.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the gateway refused the body and closed: its answer is already on the way
        return read_until_closed(sock)


def read_until_closed(sock: socket.socket) -> bytes:
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass  # closed with our unread body in its buffer: what it sent before still arrived
    return received


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def request_head(method: str, path: str, *headers: str) -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: gw", "Connection: close", *headers, "", ""]).encode()


def plain_parts(total: int):
    return (b"x" * MiB for _ in range(total // MiB))


def chunked_parts(total: int):
    return (b"%x\r\n%s\r\n" % (MiB, b"x" * MiB) for _ in range(total // MiB))


def gzip_bomb() -> bytes:
    """995 KiB of gzip members that inflate to 1,000 MiB of zeros."""
    return gzip.compress(bytes(MiB), 9) * 1000


BIG = 400 * MiB
OVERSIZED = {
    "plain-400MiB": (request_head("POST", "/v1/messages", "anthropic-version: 2023-06-01",
                                  f"Content-Length: {BIG}"), lambda: plain_parts(BIG), "anthropic"),
    "chunked-400MiB": (request_head("POST", "/v1/chat/completions", "Transfer-Encoding: chunked"),
                       lambda: chunked_parts(BIG), "openai"),
    "gzip-bomb": (request_head("POST", "/v1beta/models/gemini-2.5-flash:generateContent", "Content-Encoding: gzip",
                               f"Content-Length: {len(gzip_bomb())}"), lambda: [gzip_bomb()], "gemini"),
}
ERROR_SHAPES = {
    "anthropic": lambda body: body["type"] == "error" and body["error"]["type"] == "request_too_large",
    "openai": lambda body: set(body["error"]) == OPENAI_KEYS and body["error"]["code"] == "payload_too_large",
    "gemini": lambda body: body["error"]["code"] == 413 and body["error"]["status"] == "INVALID_ARGUMENT",
}


@pytest.mark.parametrize("case", list(OVERSIZED))
def test_oversized_bodies_are_refused_within_bounded_memory(gw, case):
    head, parts, shape = OVERSIZED[case]
    before = live.settled_snapshot(gw.store)
    reset_peak(gw.process.pid)
    start = memory_kib(gw.process.pid)["VmRSS"]
    status, _, body = parse(exchange(gw.port, head, parts()))
    peak = memory_kib(gw.process.pid)["VmHWM"]
    assert status == 413
    assert ERROR_SHAPES[shape](json.loads(body))
    assert f"limit of {LIMIT} bytes" in body.decode()
    assert (peak - start) * 1024 < 2 * LIMIT, f"RSS grew by {(peak - start) // 1024} MiB"
    assert live.settled_snapshot(gw.store) == before


def test_a_body_just_under_the_limit_still_works(gw):
    text = os.urandom((LIMIT - 4096) // 2).hex()  # compresses about 2x, like real text
    padded = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})
    response = httpx.post(f"{gw.url}/v1/chat/completions", content=gzip.compress(padded.encode()),
                          headers={"content-encoding": "gzip", "x-tracetap-session": "big-gzip"}, timeout=60)
    assert response.status_code == 200
    [row] = live.store_rows(gw.store, "session_id = 'big-gzip'")
    assert json.loads(row["request_json"])["messages"][0]["content"] == text


def client_exchange(port: int, *requests: h11.Request) -> list[tuple[h11.Response, bytes]]:
    """Requests one after another on one keep-alive connection, read by h11 (a strict client parser)."""
    conn = h11.Connection(h11.CLIENT)
    answers = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for request in requests:
            sock.sendall(conn.send(request) + conn.send(h11.EndOfMessage()))
            answers.append(read_response(conn, sock))
            conn.start_next_cycle()
    return answers


def read_response(conn: h11.Connection, sock: socket.socket) -> tuple[h11.Response, bytes]:
    response, body = None, b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return response, body


@pytest.mark.parametrize("path", ["/nope", "/", "/v1/chat/completions", "/v1/models"])
def test_head_answers_carry_no_body_and_keep_the_connection_in_sync(gw, path):
    head = h11.Request(method="HEAD", target=path, headers=[("host", "gw")])
    models = h11.Request(method="GET", target="/v1/models", headers=[("host", "gw")])
    (head_response, head_body), (next_response, next_body) = client_exchange(gw.port, head, models)
    assert head_body == b""
    assert next_response.status_code == 200 and json.loads(next_body)["object"] == "list"


def test_chunked_body_with_trailers_is_answered(gw):
    head = request_head("POST", "/v1/chat/completions", "Transfer-Encoding: chunked", "x-tracetap-session: trailers")
    body = b"%x\r\n%s\r\n0\r\nX-Checksum: abc\r\nX-Other: 1\r\n\r\n" % (len(GOOD), GOOD)
    status, _, answer = parse(exchange(gw.port, head + body, timeout=10))
    assert status == 200 and json.loads(answer)["object"] == "chat.completion"
    assert len(live.store_rows(gw.store, "session_id = 'trailers'")) == 1


MALFORMED = {
    "content-length-and-chunked": b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\n"
                                  b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "two-content-lengths": b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\n"
                           b"Content-Length: 6\r\n\r\nhello!",
    "header-without-colon": b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nNoColonHere\r\n"
                            b"Content-Length: 2\r\n\r\n{}",
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_framing_gets_an_api_error_and_a_closed_connection(gw, case):
    before = live.settled_snapshot(gw.store)
    raw = exchange(gw.port, MALFORMED[case], timeout=10)  # returns only once the gateway closed
    status, headers, body = parse(raw)
    assert status == 400
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert set(error) == OPENAI_KEYS and error["message"].startswith("malformed HTTP request")
    assert "mitmproxy" not in raw.decode() and "<html>" not in raw.decode()
    assert live.settled_snapshot(gw.store) == before


CALLERS = {  # the head of a request, up to its broken part, and how its API's errors look
    "anthropic": (b"POST /v1/messages HTTP/1.1\r\nHost: gw\r\nanthropic-version: 2023-06-01\r\n",
                  lambda body: body["type"] == "error" and body["error"]["type"] == "invalid_request_error"),
    "gemini": (b"POST /v1beta/models/gemini-2.5-flash:generateContent HTTP/1.1\r\nHost: gw\r\n",
               lambda body: body["error"]["status"] == "INVALID_ARGUMENT"),
}
BROKEN = {
    "two-content-lengths": (b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", 400),
    "header-without-colon": (b"NoColonHere\r\nContent-Length: 2\r\n\r\n{}", 400),
    "head-over-64-KiB": (b"X-Padding: " + b"p" * 70_000, 431),
}


@pytest.mark.parametrize("case", list(BROKEN))
@pytest.mark.parametrize("api", list(CALLERS))
def test_malformed_framing_is_answered_in_the_callers_api_shape(gw, api, case):
    """The API is told from what still parses: the request line's path and the header lines with a colon."""
    (head, shape), (broken, status) = CALLERS[api], BROKEN[case]
    got, headers, body = parse(exchange(gw.port, head + broken, timeout=10))
    assert (got, headers["connection"]) == (status, "close")
    assert shape(json.loads(body)), body


def test_a_broken_chunked_body_closes_the_connection(gw):
    head = request_head("POST", "/v1/chat/completions", "Transfer-Encoding: chunked")
    assert exchange(gw.port, head + b"zz\r\n{}\r\n0\r\n\r\n", timeout=10) == b""
    assert httpx.post(f"{gw.url}/v1/chat/completions", content=GOOD).status_code == 200


@pytest.mark.parametrize(("path", "headers", "shape"), [
    ("/v1/chat/completions?session_id=a%0A", {}, "openai"),
    ("/s/%20a/v1/messages", {"anthropic-version": "2023-06-01"}, "anthropic"),
    ("/v1/chat/completions?key=sk-tap-a%20", {}, "openai"),
])
def test_session_ids_with_whitespace_are_a_400(gw, path, headers, shape):
    before = live.settled_snapshot(gw.store)
    response = httpx.post(gw.url + path, content=GOOD, headers=headers)
    assert response.status_code == 400
    body = response.json()
    if shape == "anthropic":
        assert body["type"] == "error" and "session id" in body["error"]["message"]
    else:
        assert set(body["error"]) == OPENAI_KEYS and "session" in body["error"]["message"]
    assert live.settled_snapshot(gw.store) == before
