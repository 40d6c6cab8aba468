"""The mitmproxy addon: hooks only. Every call is answered by `GatewayService`; nothing is forwarded
(except the hosts a proxy-mode gateway is told to pass, capture/proxy_mode.py, and live streams: a
`StreamReply` is registered with the gateway's loopback stream server (capture/stream_server.py) and
the flow is pointed there, with its response streamed, because an addon cannot stream a body itself).

Options (all `tracetap_*`) are declared in `load` and read once in `configure`; the store writer,
the upstream client, the stream server and the idle-compaction task live from `running` to `done`.
The bounds on connections (timeouts, the cap, the stall of a stream) are options of the
`ConnectionLimits` addon (capture/connection_limits.py), handed in.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mitmproxy import ctx, http
from mitmproxy.net.http import status_codes
from mitmproxy.proxy.server_hooks import ServerConnectionHookData
from tracetap.capture.admin import Control
from tracetap.capture.connection_limits import ConnectionLimits
from tracetap.capture.content_coding import too_large
from tracetap.capture.engine_pool import EnginePool
from tracetap.capture.fence import Fence
from tracetap.capture.redact import Redactor
from tracetap.capture.replay import RecordedStore, ReplayUpstream
from tracetap.capture.service import FALLBACK_API, MAX_BODY, GatewayService, Reply, caller_api, error_reply
from tracetap.capture.sessions import NO_PROXY
from tracetap.capture.stalls import StallWatch
from tracetap.capture.stream_server import StreamServer, Timeouts
from tracetap.capture.streaming import StreamReply
from tracetap.capture.tokenizing import TokenizingUpstream
from tracetap.capture.upstream import Upstream, UpstreamClient
from tracetap.engine.tokenizer import open_tokenizer
from tracetap.store import StorePath, StoreWriter, store_path

logger = logging.getLogger("tracetap.gateway")
_PROTOCOL_ERROR_KINDS = {400: "invalid_request", 413: "payload_too_large", 431: "invalid_request"}
PASSED = "tracetap_passed"  # flow metadata: proxy mode lets this flow through, unanswered and unrecorded
STREAMED = "tracetap_streamed"  # flow metadata: answered by the stream server, its response streamed
PROXY_IDENTITY = "tracetap_proxy"  # flow metadata: the ProxyIdentity proxy mode found for the flow
SESSION_MODES = ("open", "keyed")

SWITCH_INTERVAL = 0.001  # s: the event loop shares the GIL with the record, commit-log and flusher threads;
# at CPython's 5 ms it could wait 5 ms for the GIL after a socket call (benchmarks/gateway_overhead.py, 32
# sessions: p99 165 -> 128 ms on a quiet machine, calls/s +16-27% on a busy one)


@dataclass(frozen=True)
class Settings:
    store: StorePath
    upstream: str
    pool: tuple[str, ...] = ()  # more engines: with `upstream`, a pool (capture/engine_pool.py)
    upstream_kind: str = "vllm"
    served_model: str | None = None
    timeout: float = 600.0
    max_body: int = MAX_BODY
    compact_every: float = 30.0
    idle_seconds: float = 300.0
    dead_after: float = 60.0  # this gateway silent this long is dead to others: they take its sessions over
    replay: Path | None = None  # replay mode: answer from this store (capture/replay.py)
    replay_session: str | None = None
    replay_miss: str = "error"
    replay_ignore: tuple[str, ...] = ()
    redact_keys: tuple[str, ...] = ()  # more key names whose values are secrets (capture/redact.py)
    policy_version: str | None = None  # stamped on calls until a resume names another (capture/fence.py)
    control_token: str | None = None  # guards /admin/* and session registration (capture/admin.py)
    keyed: bool = False  # calls bind by session key only (capture/sessions.py)
    pause_wait: float = 60.0  # seconds a new call waits out a pause before its 503
    on_pause: str = "finish"  # calls in flight when a pause comes: finish | abort
    tokenizer: Path | None = None  # `--tokenize gateway`: render prompts with this tokenizer (capture/tokenizing.py)


class Gateway:
    def __init__(self, connections: ConnectionLimits) -> None:
        self.settings: Settings | None = None
        self.connections = connections
        self.service: GatewayService | None = None
        self.streams = StreamServer()
        self.stalls = StallWatch()
        self._compaction: asyncio.Task | None = None

    def load(self, loader) -> None:
        loader.add_option("tracetap_store", str, "", "Store directory the gateway records into.")
        loader.add_option("tracetap_upstream", str, "", "Base URL of the upstream engine.")
        loader.add_option("tracetap_pool", Sequence[str], [], "More engines' base URLs: a pool with the first.")
        loader.add_option("tracetap_upstream_kind", str, "vllm", "Upstream kind: vllm | sglang.")
        loader.add_option("tracetap_served_model", str, "", "Served model name (else asked upstream).")
        loader.add_option("tracetap_timeout", float, 600.0, "Seconds to wait for one upstream answer.")
        loader.add_option("tracetap_max_body", int, MAX_BODY, "Largest accepted request body, in bytes.")
        loader.add_option("tracetap_compact_every", float, 30.0, "Seconds between idle-compaction passes.")
        loader.add_option("tracetap_idle_seconds", float, 300.0, "Sessions idle this long get compacted.")
        loader.add_option("tracetap_dead_after", float, 60.0, "Seconds without a heartbeat before this gateway "
                          "counts as dead to the others on the store.")
        loader.add_option("tracetap_replay", str, "", "Replay mode: answer from this recorded store.")
        loader.add_option("tracetap_replay_session", str, "", "Replay this session to every caller.")
        loader.add_option("tracetap_replay_miss", str, "error", "Replay misses: error | forward.")
        loader.add_option("tracetap_replay_ignore", Sequence[str], [], "Request paths replay matching ignores.")
        loader.add_option("tracetap_redact_keys", Sequence[str], [], "More key names whose values are masked.")
        loader.add_option("tracetap_policy_version", str, "", "Policy version stamped on calls until a resume.")
        loader.add_option("tracetap_control_token", str, "", "Token the /admin and /sessions endpoints require.")
        loader.add_option("tracetap_sessions", str, "open", "How calls name sessions: open (ids too) | keyed.")
        loader.add_option("tracetap_pause_wait", float, 60.0, "Seconds a new call waits out a pause.")
        loader.add_option("tracetap_on_pause", str, "finish", "Calls in flight at a pause: finish | abort.")
        loader.add_option("tracetap_tokenizer", str, "", "Tokenize in the gateway with this tokenizer folder.")

    def configure(self, updated: set[str]) -> None:
        if not any(name.startswith("tracetap_") for name in updated) or not ctx.options.tracetap_store:
            return
        o = ctx.options
        self.settings = Settings(
            store=store_path(o.tracetap_store), upstream=o.tracetap_upstream, pool=tuple(o.tracetap_pool),
            upstream_kind=o.tracetap_upstream_kind, served_model=o.tracetap_served_model or None,
            timeout=o.tracetap_timeout,
            max_body=o.tracetap_max_body, compact_every=o.tracetap_compact_every,
            idle_seconds=o.tracetap_idle_seconds, dead_after=o.tracetap_dead_after,
            replay=Path(o.tracetap_replay) if o.tracetap_replay else None,
            replay_session=o.tracetap_replay_session or None, replay_miss=o.tracetap_replay_miss,
            replay_ignore=tuple(o.tracetap_replay_ignore), redact_keys=tuple(o.tracetap_redact_keys),
            policy_version=o.tracetap_policy_version or None, control_token=o.tracetap_control_token or None,
            keyed=_keyed(o.tracetap_sessions),
            pause_wait=o.tracetap_pause_wait, on_pause=o.tracetap_on_pause,
            tokenizer=Path(o.tracetap_tokenizer) if o.tracetap_tokenizer else None,
        )

    async def running(self) -> None:
        if self.settings is None:
            raise RuntimeError("the tracetap gateway needs the tracetap_store option")
        s = self.settings
        clients = [UpstreamClient(url, s.upstream_kind, s.timeout, s.served_model) for url in (s.upstream, *s.pool)]
        pool = EnginePool(clients) if len(clients) > 1 else None
        upstream: Upstream = pool or clients[0]
        if s.tokenizer is not None:  # one engine (the command refuses a pool with --tokenize gateway)
            upstream = TokenizingUpstream(clients[0], await asyncio.to_thread(open_tokenizer, s.tokenizer))
        if s.replay is not None:
            upstream = ReplayUpstream(RecordedStore(s.replay), clients[0], s.replay_miss, s.replay_session,
                                      s.replay_ignore)
        # isolated: a long-lived process, whose memory must stay flat (store/committer.py)
        writer = StoreWriter(s.store, isolated=True, dead_after=s.dead_after)
        self.service = GatewayService(writer, upstream, s.max_body, Redactor(s.redact_keys),
                                      Fence(s.policy_version, s.pause_wait), Control(s.control_token), s.on_pause,
                                      pool.status if pool else None, s.keyed)
        await upstream.discover()
        await self._start_streams()
        compaction = self.service.compact_idle_forever(s.compact_every, s.idle_seconds)
        self._compaction = asyncio.create_task(compaction)
        gc.freeze()  # what startup built lives as long as the gateway: keep the collector from rescanning it
        sys.setswitchinterval(SWITCH_INTERVAL)

    async def _start_streams(self) -> None:
        limits = self.connections.settings
        self.streams = StreamServer(timeouts=Timeouts(limits.head_timeout, limits.idle_timeout),
                                    max_pending=self.connections.budget.max_pending_streams)
        self.stalls = StallWatch(limits.stream_stall)
        await self.streams.start()

    async def request(self, flow: http.HTTPFlow) -> None:
        """Answer here, always: a flow left without a response would be forwarded unrecorded."""
        if flow.response is not None or flow.metadata.get(PASSED):
            return
        try:
            reply = await self._answer(flow)
        except Exception:
            logger.exception("gateway hook failed")
            reply = error_reply(FALLBACK_API, 500, "internal gateway error (see the gateway log)", "internal")
        if isinstance(reply, StreamReply):
            _retarget(flow.request, self.streams.host, self.streams.port, self.streams.register(reply))
            flow.metadata[STREAMED] = True
            self.stalls.watch(flow.id, flow.client_conn, reply)
        else:
            flow.response = response_of(reply)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get(STREAMED) and flow.response is not None:
            flow.response.stream = True

    def server_connected(self, data: ServerConnectionHookData) -> None:
        if data.server.address == (self.streams.host, self.streams.port):
            self.stalls.limit_stream_socket(data.client.id, data.server)

    def response(self, flow: http.HTTPFlow) -> None:
        self.stalls.stop(flow.id)

    def error(self, flow: http.HTTPFlow) -> None:
        self.stalls.stop(flow.id)

    async def _answer(self, flow: http.HTTPFlow) -> Reply | StreamReply:
        if self.service is None:
            return error_reply(FALLBACK_API, 503, "the gateway is still starting", "internal")
        req = flow.request
        path = req.path.partition("?")[0]
        body = req.raw_content or b""  # still encoded: the service decodes it under its size limit
        proxy = flow.metadata.get(PROXY_IDENTITY, NO_PROXY)
        return await self.service.handle(req.method, path, lowered(req.headers), dict(req.query), body, proxy)

    def protocol_error(self, request: http.Request | None, status: int, message: str) -> http.Response:
        """mitmproxy's own refusals (malformed framing, a body over the limit) in the caller's API shape;
        `request` is None when even the request head could not be read."""
        api = FALLBACK_API if request is None else request_api(request)
        if status == 413:
            message = str(too_large(self.settings.max_body if self.settings else MAX_BODY))
        elif status != 431:  # a head over the limit: capture/framing.py says so itself
            message = "malformed HTTP request: " + message.partition(". ")[0]
        return response_of(error_reply(api, status, message, _PROTOCOL_ERROR_KINDS.get(status, "internal")))

    async def done(self) -> None:
        if self._compaction is not None:
            self._compaction.cancel()
        await self.stalls.close()
        await self.streams.stop()
        if self.service is not None:
            await self.service.upstream.aclose()
            await asyncio.to_thread(self.service.writer.close)  # pending session rows reach disk


def _keyed(mode: str) -> bool:
    if mode not in SESSION_MODES:
        raise ValueError(f"tracetap_sessions must be one of {SESSION_MODES}, got {mode!r}")
    return mode == "keyed"


def lowered(headers: http.Headers) -> dict[str, str]:
    """Lower-cased names to values, a repeated field's values joined by ", " (what `headers[name]` gives),
    in one pass over the raw fields: each `headers[name]` rescans every field (~25 us a call)."""
    out: dict[str, str] = {}
    for raw_name, raw_value in headers.fields:
        name, value = raw_name.decode("utf-8", "surrogateescape").lower(), raw_value.decode("utf-8", "surrogateescape")
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def request_api(request: http.Request) -> str:
    """The API whose error shape the request's caller parses."""
    return caller_api(request.path.partition("?")[0], lowered(request.headers))


def error_response(request: http.Request, status: int, message: str, kind: str) -> http.Response:
    """An error the gateway sends itself, in the caller's API shape."""
    return response_of(error_reply(request_api(request), status, message, kind))


def _retarget(request: http.Request, host: str, port: int, path: str) -> None:
    """Send the flow to the stream server: a bodiless GET of its ticket, over plain HTTP on loopback, in
    origin form (an absolute-form request would still name the caller's target), with the caller's HTTP
    version and Connection header, which decide how the stream is framed and whether the connection ends."""
    connection = request.headers.get("connection")
    request.scheme, request.host, request.port, request.authority = "http", host, port, ""
    request.method, request.path = "GET", path
    request.headers = http.Headers(host=f"{host}:{port}")
    if connection is not None:
        request.headers["connection"] = connection
    request.content = b""


def response_of(reply: Reply) -> http.Response:
    """mitmproxy's response for a reply, built directly: `Response.make` sets the body through its
    content-coding setter and then rescans the headers for its length (~7 us a call)."""
    fields = [(name.encode("utf-8", "surrogateescape"), value.encode("utf-8", "surrogateescape"))
              for name, value in reply.headers.items() if name.lower() != "content-length"]
    fields.append((b"content-length", str(len(reply.body)).encode()))
    now = time.time()
    reason = status_codes.RESPONSES.get(reply.status, "").encode()
    return http.Response(b"HTTP/1.1", reply.status, reason, http.Headers(fields), reply.body, None, now, now)
