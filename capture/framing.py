"""mitmproxy's HTTP/1 server edges, made to behave like an API server (mitmproxy 11.0.2 is pinned).

Three places in `mitmproxy.proxy.layers.http._http1` answer a client without any addon hook:
- protocol errors (malformed framing, a body over `body_size_limit`) get an HTML page: here they get
  the error `render` builds, in the caller's API shape, and the connection is closed as before;
- a response to HEAD is sent with its body, which desyncs keep-alive clients: here it never is;
- a chunked body with trailers raises NotImplementedError and leaves the connection hanging: here
  the trailers are dropped (no API the gateway serves gives them a meaning) and the request goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import h11
from mitmproxy import http
from mitmproxy.connection import ConnectionState
from mitmproxy.net.http import http1, status_codes
from mitmproxy.proxy import commands
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._events import HttpEvent, ResponseData, ResponseProtocolError

# (the request when its head was read, HTTP status, mitmproxy's message) -> the answer to send
Render = Callable[[http.Request | None, int, str], http.Response]


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


def assemble(request: http.Request | None, response: http.Response) -> bytes:
    """Wire bytes of `response`; only the head when it answers a HEAD."""
    if request is not None and request.method.upper() == "HEAD":
        return http1.assemble_response_head(response)
    return http1.assemble_response(response)


def _error_without_request(status_code: int, message: str = "") -> bytes:
    """mitmproxy calls this when the request head itself is malformed."""
    response = _patched.render(None, status_code, message)
    response.headers["connection"] = "close"
    return assemble(None, response)


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
        response = _patched.render(server.request, event.code, event.message)
        response.headers["connection"] = "close"
        yield commands.SendData(server.conn, assemble(server.request, response))
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
