"""The engine's HTTP front: vLLM's OpenAI-compatible routes on a stdlib threading server.

Usable in-process (`EngineServer(...).start()` in the gateway command and in tests) or alone through
`tracetap engine`. Requests run on their own threads; the model lock lets one forward pass run at a time.
A stream is written chunk by chunk (chunked transfer encoding); `pace_ms` (or $TRACETAP_ENGINE_PACE_MS)
waits that long before each chunk, so a client sees tokens arrive over time as from a real engine.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tracetap.engine import responses
from tracetap.engine.completion import MAX_MODEL_LEN, Engine
from tracetap.engine.request import EngineError, Generation, parse_chat, parse_completion, parse_json
from tracetap.engine.script import Script

SESSION_HEADER = "x-tracetap-session"
PACE_ENV = "TRACETAP_ENGINE_PACE_MS"
log = logging.getLogger("engine")


class EngineServer:
    """The embedded engine on `host:port` (port 0 picks a free one); `url` is its base URL once started."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, script: Path | None = None,
        served_model: str = "tracetap-tiny", seed: int = 0, max_model_len: int = MAX_MODEL_LEN,
        cache_dir: Path | None = None, pace_ms: float | None = None,
    ) -> None:
        self.engine = Engine(Script.load(script) if script else None, seed, max_model_len, cache_dir)
        self.served_model = served_model
        self.pace = (pace_ms if pace_ms is not None else float(os.environ.get(PACE_ENV) or 0)) / 1000
        self._address = (host, port)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the engine server is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> EngineServer:
        """Load the tokenizer and model, then serve on a background thread; returns once listening."""
        self.engine.model  # noqa: B018 - load now, so /health means ready
        self._httpd = ThreadingHTTPServer(self._address, _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._serve, name="tracetap-engine", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        assert self._httpd is not None  # set before the thread starts
        self._httpd.serve_forever(poll_interval=0.05)  # a short poll makes stop() quick

    def stop(self) -> None:
        if self._httpd is not None and self._thread is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join()
            self._httpd = self._thread = None

    def __enter__(self) -> EngineServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # Route handlers: (handler) -> (status, body) where body is a dict, a list of SSE frames or None (empty).

    def health(self, _: Handler) -> tuple[int, Any]:
        return 200, None

    def list_models(self, _: Handler) -> tuple[int, Any]:
        root = str(self.engine.home / "model")
        return 200, responses.models(self.served_model, self.engine.max_model_len, root)

    def chat(self, handler: Handler) -> tuple[int, Any]:
        request = parse_chat(parse_json(handler.body()), self.engine.max_model_len)
        _unenforced(request, handler)
        done = self.engine.complete(request, handler.headers.get(SESSION_HEADER))
        return self._answer(request, done, responses.chat_chunks, responses.chat_completion)

    def completions(self, handler: Handler) -> tuple[int, Any]:
        request = parse_completion(parse_json(handler.body()), self.engine.max_model_len)
        _unenforced(request, handler)
        done = self.engine.complete_prompt(request, handler.headers.get(SESSION_HEADER))
        return self._answer(request, done, responses.text_chunks, responses.text_completion)

    def _answer(self, request: Any, done: Any, chunks: Callable[..., Any],
                body: Callable[..., Any]) -> tuple[int, Any]:
        """A stream of `chunks` or one `body`, as the request asked."""
        args = (done, request, self.engine.tokenizer, self.served_model)
        return 200, responses.sse(chunks(*args)) if request.stream else body(*args)

    def tokenize(self, handler: Handler) -> tuple[int, Any]:
        body = parse_json(handler.body())
        if "messages" in body:
            ids = self.engine.prompt_ids(
                body["messages"], body.get("tools"), body.get("add_generation_prompt", True),
                body.get("chat_template_kwargs"),
            )
        elif isinstance(body.get("prompt"), str):
            ids = self.engine.tokenizer.encode(body["prompt"])
        else:
            raise EngineError("Either `messages` or a string `prompt` is required.", param="prompt")
        strs = self.engine.tokenizer.token_strs(ids) if body.get("return_token_strs") else None
        return 200, responses.tokenized(ids, self.engine.max_model_len, strs)

    def detokenize(self, handler: Handler) -> tuple[int, Any]:
        ids = parse_json(handler.body()).get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise EngineError("`tokens` must be a list of token ids.", param="tokens")
        return 200, {"prompt": self.engine.tokenizer.decode(ids)}


def _unenforced(request: Generation, handler: Handler) -> None:
    """The engine samples freely: the structured outputs a request asked for are logged as not enforced (one
    JSON line, the request's session first), never pretended to be honoured."""
    if request.constraints:
        log.warning("session %s: structured outputs not enforced by the embedded engine: %s",
                    handler.headers.get(SESSION_HEADER), json.dumps(request.constraints, sort_keys=True))


ROUTES = {
    "/health": ("GET", EngineServer.health),
    "/v1/models": ("GET", EngineServer.list_models),
    "/v1/chat/completions": ("POST", EngineServer.chat),
    "/v1/completions": ("POST", EngineServer.completions),
    "/tokenize": ("POST", EngineServer.tokenize),
    "/detokenize": ("POST", EngineServer.detokenize),
}


class Handler(BaseHTTPRequestHandler):
    """Keep-alive HTTP/1.1 with Nagle off (otherwise each keep-alive request waits ~40 ms on delayed ACKs)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "tracetap-engine"
    engine_server: EngineServer

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def body(self) -> bytes:
        return self._body

    def _dispatch(self) -> None:
        # Always drain the body, even for errors, or the next keep-alive request would read its leftovers.
        self._body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = urlsplit(self.path).path.rstrip("/") or "/"
        method, route = ROUTES.get(path, (None, None))
        try:
            if route is None:
                raise EngineError("Not Found", 404, "NotFoundError")
            if method != self.command:
                raise EngineError("Method Not Allowed", 405, "MethodNotAllowed")
            status, payload = route(self.engine_server, self)
        except EngineError as exc:
            status, payload = exc.status, exc.body()
        except Exception as exc:  # a bug here must not kill the connection thread silently
            log.exception("engine request failed")
            status, payload = 500, EngineError(f"Internal error: {exc}", 500, "InternalServerError").body()
        self._send(status, payload)

    def _send(self, status: int, payload: Any) -> None:
        if isinstance(payload, list):
            return self._stream(status, payload)
        data = b"" if payload is None else json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, status: int, frames: list[bytes]) -> None:
        """Each frame as one HTTP chunk, flushed, after the pace; a client that left ends it."""
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for frame in frames:
                time.sleep(self.engine_server.pace)
                self.wfile.write(b"%x\r\n%b\r\n" % (len(frame), frame))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away: the request is aborted

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)


def _handler(server: EngineServer) -> type[Handler]:
    """A handler class bound to one server (the stdlib instantiates it per request)."""
    return type("BoundHandler", (Handler,), {"engine_server": server})
