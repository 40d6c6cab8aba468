"""mitmproxy's HTTP/1 server edges, made to behave like an API server (mitmproxy 11.0.2 is pinned).

Four places in `mitmproxy.proxy.layers.http._http1` answer a client without any addon hook:
- protocol errors (malformed framing, a body over `body_size_limit`) get an HTML page: here they get
  the error `render` builds, in the caller's API shape, and the connection is closed as before. A head
  too malformed to parse (a header without a colon, two Content-Lengths) is shaped from what it still
  tells: its request line's path and the header lines that parse;
- a request head may grow without limit ("FIXME: protect against header size DoS"): here one over
  MAX_HEAD bytes is a 431 and the connection closed;
- a response to HEAD is sent with its body, which desyncs keep-alive clients: here it never is;
- a chunked body with trailers raises NotImplementedError and leaves the connection hanging: here
  the trailers are dropped (no API the gateway serves gives them a meaning) and the request goes on.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import h11
from mitmproxy import http
from mitmproxy.connection import ConnectionState
from mitmproxy.net.http import http1, status_codes
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._events import HttpEvent, ResponseData, ResponseProtocolError

# (the request when its head was read, HTTP status, mitmproxy's message) -> the answer to send
Render = Callable[[http.Request | None, int, str], http.Response]
MAX_HEAD = 64 * 1024  # bytes of a request head
_HEAD_END = re.compile(rb"\r?\n\r?\n")  # where mitmproxy's reader (h11's) ends a head


@dataclass
class _Patches:
    render: Render
    installed: bool = False


_patched = _Patches(render=lambda request, status, message: http.Response.make(status, message))


def install(render: Render) -> None:
    """Patch mitmproxy's HTTP/1 server once per process; later calls only replace `render`."""
    _patched.render = render
    if _patched.installed:
        return
    _patched.installed = True
    _http1.make_error_response = _error_without_request
    _http1.make_body_reader = _reader_without_trailers(_http1.make_body_reader)
    _http1.Http1Server.send = _server_send(_http1.Http1Server.send)  # type: ignore[method-assign]
    _http1.Http1Server.read_headers = _reading_headers(_http1.Http1Server.read_headers)  # type: ignore[method-assign]


def assemble(request: http.Request | None, response: http.Response) -> bytes:
    """Wire bytes of `response`; only the head when it answers a HEAD."""
    if request is not None and request.method.upper() == "HEAD":
        return http1.assemble_response_head(response)
    return http1.assemble_response(response)


def _answer(request: http.Request | None, status: int, message: str) -> bytes:
    """The rendered error, closing the connection."""
    response = _patched.render(request, status, message)
    response.headers["connection"] = "close"
    return assemble(request, response)


class _Refusal(bytes):
    """mitmproxy's answer to a head it could not read, shaped as if no head was read, and what it says:
    `_reading_headers` shapes it again from what the head still tells."""

    status: int
    message: str


def _error_without_request(status_code: int, message: str = "") -> bytes:
    """mitmproxy calls this when the request head itself is malformed."""
    refusal = _Refusal(_answer(None, status_code, message))
    refusal.status, refusal.message = status_code, message
    return refusal


def _reading_headers(original: Callable) -> Callable:
    def read_headers(self: _http1.Http1Server, event: events.ConnectionEvent) -> Iterator[commands.Command]:
        buffered: bytearray = self.buf._data  # h11's ReceiveBuffer, searched in place: never copied per read
        if len(buffered) > MAX_HEAD and not _HEAD_END.search(buffered, 0, MAX_HEAD + 4):
            yield from _head_too_large(self, bytes(buffered[:MAX_HEAD]))
            return
        received = bytes(buffered) if _completes_head(buffered, event) else b""
        for command in original(self, event):  # its commands are never blocking: nothing is sent back
            yield _shaped(command, received)
    return read_headers


def _completes_head(buffered: bytearray, event: events.ConnectionEvent) -> bool:
    """Whether a head ends in what `event` added (or anywhere, for mitmproxy's re-read of what it holds)."""
    if not isinstance(event, events.DataReceived):
        return False
    start = max(0, len(buffered) - len(event.data) - 3) if event.data else 0
    return _HEAD_END.search(buffered, start) is not None


def _head_too_large(server: _http1.Http1Server, received: bytes) -> Iterator[commands.Command]:
    message = f"the request head is larger than {MAX_HEAD} bytes"
    yield commands.SendData(server.conn, _answer(_lenient_request(received), 431, message))
    yield commands.CloseConnection(server.conn)
    server.state = server.done


def _shaped(command: commands.Command, received: bytes) -> commands.Command:
    """A refusal of a malformed head, in the API shape its path and readable headers point to."""
    if isinstance(command, commands.SendData) and isinstance(command.data, _Refusal):
        data = _answer(_lenient_request(received), command.data.status, command.data.message)
        return commands.SendData(command.connection, data)
    return command


def _lenient_request(received: bytes) -> http.Request | None:
    """What a malformed request head still tells: the method and path of its request line and the header
    lines that parse (`name: value`); None without a request line of three parts."""
    head = _HEAD_END.split(received[:MAX_HEAD + 4], 1)[0]
    request_line, *lines = [line.rstrip(b"\r") for line in head.split(b"\n")]
    parts = request_line.split()
    if len(parts) != 3:
        return None
    method, target, version = parts
    fields = [(name.strip(), value.strip()) for name, colon, value in (line.partition(b":") for line in lines)
              if colon and name.strip()]
    now = time.time()
    return http.Request("", 0, method, b"http", b"", _origin_form(target), version, http.Headers(fields), None,
                        None, now, now)


def _origin_form(target: bytes) -> bytes:
    """The path of a request target (`/v1/x`, or `http://host/v1/x` in absolute form)."""
    if target.startswith(b"/"):
        return target
    return b"/" + target.partition(b"://")[2].partition(b"/")[2]


def _server_send(original: Callable) -> Callable:
    def send(self: _http1.Http1Server, event: HttpEvent) -> Iterator[commands.Command]:
        if isinstance(event, ResponseProtocolError):
            yield from _protocol_error(self, event)
        elif isinstance(event, ResponseData) and _answers_head(self):
            return
        else:
            yield from original(self, event)
    return send


def _protocol_error(server: _http1.Http1Server, event: ResponseProtocolError) -> Iterator[commands.Command]:
    """What mitmproxy does with a protocol error, with the API's error instead of its HTML page."""
    if not server.conn.state & ConnectionState.CAN_WRITE:
        return
    if not server.response and event.code != status_codes.NO_RESPONSE:
        yield commands.SendData(server.conn, _answer(server.request, event.code, event.message))
    yield commands.CloseConnection(server.conn)


def _answers_head(server: _http1.Http1Server) -> bool:
    return server.request is not None and server.request.method.upper() == "HEAD"


class _TrailerlessReader:
    """A chunked-body reader whose end of message carries no trailers."""

    def __init__(self, reader: Any):  # mitmproxy's ChunkedReader
        self.reader = reader

    def __call__(self, buf: object) -> h11.Data | h11.EndOfMessage | None:
        return _drop_trailers(self.reader(buf))

    def read_eof(self) -> h11.Data | h11.EndOfMessage | None:
        return _drop_trailers(self.reader.read_eof())


def _drop_trailers(event: h11.Data | h11.EndOfMessage | None) -> h11.Data | h11.EndOfMessage | None:
    return h11.EndOfMessage() if isinstance(event, h11.EndOfMessage) and event.headers else event


def _reader_without_trailers(make: Callable) -> Callable:
    def make_body_reader(expected_size: int | None) -> object:
        reader = make(expected_size)
        return _TrailerlessReader(reader) if expected_size is None else reader
    return make_body_reader
