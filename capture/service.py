"""The gateway's request handling, free of mitmproxy so it can be driven and tested directly.

`GatewayService.handle(method, path, headers, query, body) -> Reply | StreamReply` answers every call
itself: bind the session, detect the API, check and parse the body, translate with the provider adapter,
call the upstream once (with token data), record the call durably, and only then answer (JSON). A
streamed call to an upstream that streams token ids is a `StreamReply` (capture/streaming.py): events
as the upstream generates, the terminal ones once the call is recorded; other streamed calls get the
synthetic stream of the whole answer. Client errors are answered in the caller's API shape and
never recorded as completions; upstream failures are recorded with their status and no tokens. An
answer that is not training data (no token ids, misaligned logprobs, ...) is recorded `degraded` and
still answered. Every call without a completions row (probes, model lists, token counts, errors) is
counted per session. The body sent upstream is redacted (capture/redact.py) like everything stored.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TypeVar

from tracetap.capture import admin, content_coding
from tracetap.capture import detect as routes
from tracetap.capture.adapters import ADAPTERS, MODEL_LISTERS, TOKEN_COUNTERS
from tracetap.capture.adapters.base import Adapter, AdapterError, RequestContext
from tracetap.capture.bounded import RecentSet
from tracetap.capture.capabilities import Capabilities
from tracetap.capture.control_plane import ControlPlane, FenceSettings
from tracetap.capture.fence import RETRY_AFTER, Aborted, Fence, Paused
from tracetap.capture.json_body import BodyError, parse_body
from tracetap.capture.jsontext import dump_bytes
from tracetap.capture.record import Call, build_row, display_path
from tracetap.capture.redact import DEFAULT, Redactor, Seen
from tracetap.capture.replies import FALLBACK_API, JSON_TYPE, Reject, Reply, error_reply
from tracetap.capture.sessions import (
    NO_PROXY,
    Binding,
    ProxyIdentity,
    SessionError,
    api_key,
    bind,
    harness_ids,
    labels,
    split_prefix,
)
from tracetap.capture.streaming import Collected, Ending, LiveStream, StreamReply
from tracetap.capture.upstream import NO_CHOICES, Upstream, UpstreamError, UpstreamResult
from tracetap.store import SessionOwned, StoreWriter

logger = logging.getLogger("tracetap.gateway")
T = TypeVar("T")

MAX_BODY = 32 * 1024 * 1024
MAX_REGISTERED = 16384  # explicitly named session ids an API key may still bind to (most recent)
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache", "x-accel-buffering": "no"}
EXPLICIT_SOURCES = ("path", "header", "query")  # ids a harness named, so later API keys may reuse them
_UNRECORDED: dict[str | None, str] = {routes.PROBE: "probe", routes.MODELS: "models",
                                      routes.COUNT_TOKENS: "count_tokens"}
_CONTROL = (routes.SESSION_REGISTER, routes.SESSION_CLOSE, routes.SESSION_COMPLETE, routes.ADMIN)
_SESSION_ERROR_KINDS = {400: "invalid_request", 401: "unauthorized", 403: "forbidden"}


@dataclass
class Request:
    """One incoming call as the service sees it; headers lower-cased."""

    method: str
    path: str
    headers: dict[str, str]
    query: Mapping[str, str]
    body: bytes
    received: float = field(default_factory=time.perf_counter)
    labels: dict[str, str] = field(default_factory=dict)  # task_id / policy_version the caller named
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    endpoint: str | None = None  # routes.GENERATE, routes.PROBE, ... once detected
    recorded: bool = False  # a completions row holds this call
    proxy: ProxyIdentity = NO_PROXY
    binding: Binding | None = None  # its session, once bound


class GatewayService:
    """Holds the store writer and the upstream client. An open gateway (not `keyed`) also binds calls by
    session id (capture/sessions.py); there, ids harnesses named explicitly count as registered: an API
    key equal to one binds to it (DESIGN §4); the most recent MAX_REGISTERED of them are kept."""

    def __init__(self, writer: StoreWriter, upstream: Upstream, max_body: int = MAX_BODY,
                 redactor: Redactor = DEFAULT, fence: Fence | None = None, control: admin.Control | None = None,
                 on_pause: str = "finish", engines: Callable[[], dict] | None = None, keyed: bool = False):
        self.writer = writer
        self.upstream = upstream
        self.fence = fence or Fence()
        self.on_pause = on_pause  # what a pause does to calls in flight unless it says: finish | abort
        self.max_body = max_body
        self.redactor = redactor
        self.keyed = keyed
        self.registered: RecentSet[str] = RecentSet(MAX_REGISTERED)
        self.capabilities = Capabilities(writer.root)
        self.control_plane = ControlPlane(writer, self.capabilities, control or admin.Control(),
                                          FenceSettings(self.fence, on_pause, engines), redactor, self.registered)
        self._serving = 0  # calls in `handle` now: a lone one records without thread hand-offs

    async def handle(self, method: str, path: str, headers: Mapping[str, str], query: Mapping[str, str],
                     body: bytes, proxy: ProxyIdentity = NO_PROXY) -> Reply | StreamReply:
        request = Request(method.upper(), path, {k.lower(): v for k, v in headers.items()}, query, body,
                          proxy=proxy)
        api = caller_api(path, request.headers)
        self._serving += 1
        try:
            reply = await self._dispatch(request)
        except Reject as exc:
            reply = error_reply(exc.api or api, exc.status, str(exc), exc.kind)
            reply.headers.update(exc.headers)
        except Exception:
            logger.exception("gateway failed on %s %s", request.method, split_prefix(path)[1])
            reply = error_reply(api, 500, "internal gateway error (see the gateway log)", "internal")
        finally:
            self._serving -= 1
        await self._count_unrecorded(request, reply.status)
        return reply

    async def _count_unrecorded(self, request: Request, status: int) -> None:
        """A call answered without a completions row is still counted under its session, if it was bound
        to one. A refused call never makes a session: it counts only under one the store already has."""
        kind = _unrecorded_kind(request, status)
        if kind is None or request.binding is None:
            return
        sid = request.binding.session_id
        try:
            if status < 400 or await asyncio.to_thread(self.writer.has_session, sid):
                await asyncio.to_thread(self.writer.note_unrecorded, sid, kind)
        except SessionOwned:
            pass  # another gateway records the session (a 409 was this call's answer): nothing is kept here
        except Exception:
            logger.exception("could not count an unrecorded %s call", kind)

    async def _dispatch(self, request: Request) -> Reply | StreamReply:
        provider_path = split_prefix(request.path)[1]
        route = routes.detect(request.method, provider_path, request.headers)
        request.endpoint = route.endpoint
        try:
            data = self._body(request, route)
            if data is not None:
                route = routes.detect(request.method, provider_path, request.headers, data)
            if route.endpoint in _CONTROL:
                return await self._control(request, route)
            request.binding = await self._bind(request, route)
            request.labels = labels(provider_path, request.headers, request.query)
            handler = self._handlers()[route.endpoint]
            return await handler(request, route, request.binding, data)
        except Reject as exc:
            exc.api = exc.api or route.api
            raise
        except SessionError as exc:
            raise Reject(exc.status, str(exc), _SESSION_ERROR_KINDS[exc.status], api=route.api) from None

    async def _bind(self, request: Request, route: routes.Route) -> Binding | None:
        """The call's session: by the session key it presents (the proxy credential, else its API key), or,
        on an open gateway, by the ids it names. Probes and model lists need none on a keyed gateway."""
        proxy = request.proxy
        secret = proxy.user if proxy.user is not None else api_key(request.headers, request.query)
        owner = await self._owner(proxy, secret)
        try:
            return bind(request.path, request.headers, request.query, self.registered, owner=owner,
                        proxy_user=None if owner else proxy.user, keyed=self.keyed)
        except SessionError as exc:
            if exc.status != 401 or route.endpoint in (routes.GENERATE, routes.COUNT_TOKENS):
                raise
            return None

    async def proxy_session(self, identity: ProxyIdentity) -> str | None:
        """The session of a proxied connection, for its refusals: its key's, the launcher's when it has no
        credential, or (on an open gateway) the id its credential names."""
        owner = await self._owner(identity, identity.user)
        if owner is not None or identity.user is None:
            return owner
        return None if self.keyed else identity.user

    async def _owner(self, proxy: ProxyIdentity, secret: str | None) -> str | None:
        """The session whose key `secret` is; for a proxied call without a credential, the one the gateway's
        launcher named (`--proxy-session`)."""
        owner = await self.capabilities.key_owner(secret)
        return owner if owner is not None or proxy.user is not None else proxy.fallback

    async def _control(self, request: Request, route: routes.Route) -> Reply:
        """The gateway's own endpoints (capture/control_plane.py): no session binding, tokens instead."""
        handler = {routes.SESSION_REGISTER: self.control_plane.register, routes.SESSION_CLOSE: self.control_plane.close,
                   routes.SESSION_COMPLETE: self.control_plane.complete, routes.ADMIN: self.control_plane.admin}
        try:
            return await handler[route.endpoint](request.headers, request.body, route.target)
        except SessionOwned as exc:  # registering, closing or completing a session another gateway records
            raise Reject(409, str(exc), "conflict") from None

    def _handlers(self) -> dict:
        return {routes.GENERATE: self._generate, routes.COUNT_TOKENS: self._count_tokens,
                routes.MODELS: self._models, routes.PROBE: self._probe, routes.NOT_FOUND: self._not_found}

    def _body(self, request: Request, route: routes.Route) -> dict | None:
        try:
            request.body = content_coding.decoded(request.body, request.headers.get("content-encoding"), self.max_body)
        except content_coding.BodyRefused as exc:
            raise Reject(exc.status, str(exc), exc.kind) from None
        if route.endpoint not in (routes.GENERATE, routes.COUNT_TOKENS):
            return None
        try:
            data = parse_body(request.body)
        except BodyError as exc:
            raise Reject(400, str(exc)) from None
        if not isinstance(data, dict):
            raise Reject(400, "request body must be a JSON object")
        return data

    async def _generate(self, request: Request, route: routes.Route, binding, data: dict) -> Reply | StreamReply:
        adapter = _adapter(route.api)
        ctx = await self._context(route, binding, data, request.created_at)
        redacted: Seen = {}
        chat_request = self.redactor.redact(_translate(adapter, data, ctx), redacted)
        try:
            await self.writer.own(binding.session_id)  # a valid call, before anything goes upstream
        except SessionOwned as exc:
            raise Reject(409, str(exc), "conflict", api=route.api) from None
        except Exception as exc:  # the store refused the claim: nothing could be recorded
            logger.exception("could not claim session %s", binding.session_id)
            raise Reject(500, "the gateway could not record this call", "internal", api=route.api) from exc
        if binding.source in EXPLICIT_SOURCES:
            self.registered.add(binding.session_id)
        call = Call(session_id=binding.session_id, api=route.api,
                    path=display_path(binding.path, request.query), stream=route.stream,
                    requested_model=ctx.requested_model, request_body=data, completion_id=ctx.completion_id,
                    user_agent=request.headers.get("user-agent"), session_source=binding.source,
                    served_model=ctx.served_model, chat_request=chat_request, labels=request.labels,
                    harness_ids=harness_ids(request.headers), created_at=request.created_at,
                    started=request.received, redacted=redacted)
        if route.stream and self.upstream.streams_tokens:
            return await self._streamed(request, call, adapter, ctx, chat_request)
        return await self._answered_whole(request, call, adapter, ctx, chat_request)

    async def _answered_whole(self, request: Request, call: Call, adapter: Adapter, ctx: RequestContext,
                              chat_request: dict) -> Reply:
        """Recorded, then answered: JSON, or the synthetic stream of the whole answer."""
        collected = Collected()
        try:
            result = await self._fenced(call, lambda: self._whole(call, chat_request, collected))
        except (UpstreamError, Aborted) as exc:
            reply = await self._upstream_failed(call, adapter, exc, collected.partial())
            request.recorded = True
            return reply
        _answered(call, result)
        if NO_CHOICES in result.capture.problems:  # nothing to answer with: a 502, recorded as degraded
            reply = await self._no_answer(call, adapter)
            request.recorded = True
            return reply
        if result.reply_as is not None:  # a replay shows the recorded call's ids, byte for byte
            ctx = replace(ctx, completion_id=result.reply_as[0], created=result.reply_as[1])
        call.response_body = adapter.from_chat_response(result.body, ctx)
        events = adapter.to_sse_events(result.body, ctx) if call.stream else None
        await self._record(call)
        request.recorded = True
        if events is None:
            return Reply(200, dump_bytes(call.response_body), {"content-type": JSON_TYPE, **_ids(call)})
        return Reply(200, b"".join(events), {**SSE_HEADERS, **_ids(call)})

    async def _streamed(self, request: Request, call: Call, adapter: Adapter, ctx: RequestContext,
                        chat_request: dict) -> Reply | StreamReply:
        """Answered as the upstream generates; a refusal before the stream is answered like a whole call's."""
        try:
            stream = await self._fenced(
                call, lambda: self.upstream.chat_stream(chat_request, call.session_id, call.completion_id))
        except (UpstreamError, Aborted) as exc:
            request.recorded = True
            return await self._upstream_failed(call, adapter, exc)
        request.recorded = True  # by the stream, however it ends
        record = functools.partial(self._record_stream, call, adapter, ctx)
        body = LiveStream(stream, adapter.translator(ctx), record, self.fence)
        return StreamReply(200, {**SSE_HEADERS, **_ids(call)}, body)

    async def _whole(self, call: Call, chat_request: dict, collected: Collected) -> UpstreamResult:
        """A whole answer. Under `--on-pause abort` it is read as a stream when the upstream streams token
        ids, so a call a pause cuts short keeps what was sampled (`collected`)."""
        if self.on_pause == "abort" and self.upstream.streams_tokens:
            return await collected.read(self.upstream.chat_stream(chat_request, call.session_id, call.completion_id))
        return await self.upstream.chat(chat_request, call.session_id, call.completion_id)

    async def _fenced(self, call: Call, send: Callable[[], Awaitable[T]]) -> T:
        """The upstream call under the fence: it waits out a pause (or is a 503), names the policy version
        in force when it was sent (a caller's own label wins), and a pause may abort it (Aborted)."""
        try:
            version = await self.fence.admit()
        except Paused as exc:
            raise Reject(503, str(exc), "unavailable", headers={"retry-after": str(RETRY_AFTER)}) from None
        if version is not None:
            call.labels = {"policy_version": version, **call.labels}
        return await self.fence.upstream(send())

    async def _record_stream(self, call: Call, adapter: Adapter, ctx: RequestContext,
                             outcome: UpstreamResult | UpstreamError, ending: Ending) -> None:
        """The record of a streamed call: its answer (partial when it ended early) and how it ended."""
        if isinstance(outcome, UpstreamError):
            _failed_fields(call, adapter, outcome)
        else:
            _answered(call, outcome)
            call.response_body = adapter.from_chat_response(outcome.body, ctx)
        if ending.status != "ok":
            _cut_short(call, adapter, ending)
        await self._record(call)

    async def _no_answer(self, call: Call, adapter: Adapter) -> Reply:
        call.http_status = 502
        call.response_body = adapter.error_body(502, call.error or NO_CHOICES, "upstream_error")
        await self._record(call)
        return Reply(502, dump_bytes(call.response_body))

    async def _context(self, route: routes.Route, binding, data: dict, received: datetime) -> RequestContext:
        requested = route.model or "unknown"
        served = await self.upstream.resolve_model(requested)
        return RequestContext(
            requested_model=requested, served_model=served or requested, stream=route.stream,
            completion_id="cmpl-" + uuid.uuid4().hex, created=int(received.timestamp()), path=binding.path,
            extra={"request": data, "session_id": binding.session_id},
        )

    async def _upstream_failed(self, call: Call, adapter: Adapter, exc: UpstreamError | Aborted,
                               partial: UpstreamResult | None = None) -> Reply:
        if isinstance(exc, Aborted):
            return await self._aborted(call, adapter, exc, partial)
        _failed_fields(call, adapter, exc)
        await self._record(call)
        return Reply(exc.status, dump_bytes(call.response_body), {"content-type": JSON_TYPE, **exc.headers})

    async def _aborted(self, call: Call, adapter: Adapter, exc: Aborted, partial: UpstreamResult | None) -> Reply:
        """Recorded (flagged, never ok; with the tokens sampled before the abort, when the call was read
        as a stream) and answered 503 with Retry-After: harnesses retry, after the resume."""
        if partial is not None:
            _answered(call, partial)
        _cut_short(call, adapter, _aborted_ending(exc))
        await self._record(call)
        return Reply(503, dump_bytes(call.response_body), {"content-type": JSON_TYPE, "retry-after": str(RETRY_AFTER)})

    async def _record(self, call: Call) -> None:
        """Durable before the harness sees a byte: a failed write is a 500, never a silent loss."""
        row = build_row(call, redactor=self.redactor)
        try:
            await self.writer.record_completion_async(row, alone=self._serving == 1)
        except Exception as exc:
            logger.exception("could not record %s of session %s", call.completion_id, call.session_id)
            raise Reject(500, "the gateway could not record this call", "internal") from exc

    async def _count_tokens(self, request: Request, route: routes.Route, binding, data: dict) -> Reply:
        adapter = _adapter(route.api)
        counter = TOKEN_COUNTERS.get(route.api)
        if counter is None:
            raise Reject(404, f"{route.api} has no token-count endpoint", "not_found")
        ctx = await self._context(route, binding, data, request.created_at)
        try:
            count = await self.upstream.tokenize(self.redactor.redact(_translate(adapter, data, ctx)))
        except UpstreamError as exc:
            raise Reject(exc.status, str(exc), exc.reply_kind) from None
        return Reply(200, dump_bytes(counter.count_tokens_body(count)))

    async def _models(self, request: Request, route: routes.Route, binding, data: None) -> Reply:
        """The served models in the caller's list shape; any name exists (unknown ones map to the served)."""
        lister = MODEL_LISTERS.get(route.api) or MODEL_LISTERS[FALLBACK_API]
        if route.target:
            return Reply(200, dump_bytes(lister.model_body(route.target)))
        names = list(self.upstream.models) or list(await self.upstream.discover())
        return Reply(200, dump_bytes(lister.models_body(names)))

    async def _probe(self, request: Request, route: routes.Route, binding, data: None) -> Reply:
        body = b"" if request.method == "HEAD" else dump_bytes({"status": "ok", "service": "tracetap-gateway"})
        return Reply(200, body)

    async def _not_found(self, request: Request, route: routes.Route, binding, data: None) -> Reply:
        path = split_prefix(request.path)[1]
        raise Reject(404, f"unknown endpoint {request.method} {path}", "not_found")

    async def compact_idle_forever(self, every: float, idle_seconds: float) -> None:
        """Compact sessions idle longer than `idle_seconds`, every `every` seconds, until cancelled."""
        while True:
            await asyncio.sleep(every)
            try:
                await asyncio.to_thread(self.writer.compact_idle, idle_seconds)
            except Exception:
                logger.exception("idle compaction failed")


def _unrecorded_kind(request: Request, status: int) -> str | None:
    """Which of UNRECORDED_KINDS (store/schema.py) this call counts as; None when it is recorded."""
    if request.recorded or request.endpoint in _CONTROL:
        return None
    if status >= 400:
        return "server_error" if status >= 500 else "client_error"
    return _UNRECORDED.get(request.endpoint)


def caller_api(path: str, headers: Mapping[str, str]) -> str:
    """The API whose error shape the caller parses, from its path (session prefix included) and
    lower-cased headers alone."""
    return routes.plausible_api(split_prefix(path)[1], headers)


def _adapter(api: str) -> Adapter:
    if api not in ADAPTERS:
        raise Reject(404, f"the {api} API is not supported by this gateway yet", "not_found")
    return ADAPTERS[api]


def _translate(adapter: Adapter, data: dict, ctx: RequestContext) -> dict:
    try:
        return adapter.to_chat_request(data, ctx)
    except AdapterError as exc:
        raise Reject(exc.status, str(exc), exc.kind) from None


def _ids(call: Call) -> dict[str, str]:
    return {"x-tracetap-session": call.session_id, "x-tracetap-completion-id": call.completion_id}


def _failed_fields(call: Call, adapter: Adapter, exc: UpstreamError) -> None:
    """What a failed upstream call tells the record (no tokens: the upstream gave none that are usable)."""
    call.status = exc.recorded_status
    call.metadata, call.engine = exc.metadata, exc.engine
    call.http_status, call.error, call.upstream_body = exc.status, str(exc), exc.body
    call.chat_request = exc.request or call.chat_request
    call.response_body = adapter.error_body(exc.status, str(exc), exc.reply_kind)


def _aborted_ending(exc: Aborted) -> Ending:
    return Ending("aborted", 503, str(exc), "unavailable")


def _cut_short(call: Call, adapter: Adapter, ending: Ending) -> None:
    """A call that ended before the upstream finished it: flagged with how it ended, never ok. A pause
    abort is `finish_reason = abort`; a client that left got no error, so its partial answer is kept."""
    call.status, call.http_status, call.error = ending.status, ending.http_status, ending.error
    call.partial = call.capture is not None
    if ending.status == "aborted":
        call.finish_reason = "abort"
    if ending.status != "disconnected":
        call.response_body = adapter.error_body(ending.http_status, ending.error or ending.status, ending.kind)


def _answered(call: Call, result: UpstreamResult) -> None:
    """What the upstream's answer tells the record; problems make the call `degraded`."""
    call.chat_request, call.capture, call.upstream_ms = result.request, result.capture, result.ms
    call.chat_request_json, call.engine = result.request_json, result.engine
    call.served_model = result.body.get("model") or call.served_model
    call.metadata = result.metadata
    if result.capture.problems:
        call.status, call.error = "degraded", "; ".join(result.capture.problems)

