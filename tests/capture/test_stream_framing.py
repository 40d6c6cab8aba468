"""A live stream is framed and ended the way its client asked, over raw sockets against a real gateway:
an absolute-form request (`POST http://host:port/v1/...`, as clients configured with a proxy send) is
answered like any other; an HTTP/1.0 client gets no chunked coding and the connection ends with the
stream; `Connection: close` closes the connection after the stream; a keep-alive client keeps it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import h11
import live
import pytest

REPLY = "Framed the way the client asked."
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()


@pytest.fixture(scope="module")
def gw(tmp_path_factory) -> Iterator[live.GatewayProcess]:
    with live.scripted_gateway(tmp_path_factory.mktemp("framing"), [{"content": REPLY}],
                               "--control-token", "a-control-token-for-framing") as process:
        yield process


def request(target: str, session: str, version: str = "HTTP/1.1", *headers: str) -> bytes:
    lines = [f"POST {target} {version}", "Host: gw", f"x-tracetap-session: {session}", *headers,
             f"Content-Length: {len(BODY)}", "", ""]
    return "\r\n".join(lines).encode() + BODY


def until_closed(port: int, data: bytes) -> bytes:
    """Everything the gateway sends until it closes the connection (a socket timeout fails the test)."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(data)
        return b"".join(iter(lambda: sock.recv(65536), b""))


def streamed_text(sse: bytes) -> str:
    """The content deltas of an OpenAI chat stream, joined; the stream must end with [DONE]."""
    payloads = [line[6:] for line in sse.decode().splitlines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    return "".join(json.loads(p)["choices"][0]["delta"].get("content") or "" for p in payloads[:-1])


def parsed(raw: bytes) -> tuple[h11.Response, bytes]:
    """The response as h11 (a strict client) reads it, for a request it sent itself."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("host", "gw"), ("content-length", "0")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(raw)
    conn.receive_data(b"")
    response, body = conn.next_event(), b""
    while isinstance(event := conn.next_event(), h11.Data):
        body += event.data
    assert isinstance(response, h11.Response) and isinstance(event, h11.EndOfMessage)
    return response, body


def test_an_absolute_form_streamed_request_is_answered(gw):
    raw = until_closed(gw.port, request(f"http://127.0.0.1:{gw.port}/v1/chat/completions", "absolute", "HTTP/1.1",
                                        "Connection: close"))
    response, body = parsed(raw)
    assert response.status_code == 200 and streamed_text(body) == REPLY
    [row] = live.store_rows(gw.store, "session_id = 'absolute'")
    assert (row["status"], row["stream"]) == ("ok", True)


def test_an_http_1_0_client_gets_no_chunks_and_the_stream_ends_with_the_connection(gw):
    raw = until_closed(gw.port, request("/v1/chat/completions", "http10", "HTTP/1.0"))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n")[0]
    assert b"transfer-encoding" not in head.lower() and b"content-length" not in head.lower()
    assert streamed_text(body) == REPLY  # raw SSE, no chunk sizes in between


def test_connection_close_closes_the_connection_after_the_stream(gw):
    raw = until_closed(gw.port, request("/v1/chat/completions", "closing", "HTTP/1.1", "Connection: close"))
    response, body = parsed(raw)
    assert (b"connection", b"close") in response.headers and streamed_text(body) == REPLY


def test_a_kept_alive_stream_leaves_the_connection_open(gw):
    with socket.create_connection(("127.0.0.1", gw.port), timeout=15) as sock:
        sock.sendall(request("/v1/chat/completions", "kept"))
        received = b""
        while not received.endswith(b"0\r\n\r\n"):
            received += sock.recv(65536)
        sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # no end of stream: the connection waits for the next request
    response, body = parsed(received)
    assert (b"connection", b"close") not in response.headers and streamed_text(body) == REPLY
