"""The upstream engine client (vLLM, SGLang, the embedded engine) and the pure parsers of its answers.

The gateway calls `/v1/chat/completions` asking for token data, over a keep-alive pool
(capture/http1.py): whole (`chat`), or as a stream of vLLM chunks (`chat_stream`, when the upstream
`streams_tokens`) folded as they pass into the same answer. Parsing is pure and kept apart from I/O so
real vLLM bodies (fixtures) and live answers go through one path:
`parse_chat_response(body) -> TokenCapture`, `parse_chat_stream(sse_text) -> TokenCapture`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from tracetap.capture import answer_fields as fields
from tracetap.capture import sse
from tracetap.capture.answer_fields import InvalidAnswer
from tracetap.capture.chat_fold import ChatFold, fold_chat_stream
from tracetap.capture.http1 import Opened, Pool, Response
from tracetap.capture.json_body import parse_body
from tracetap.capture.jsontext import dump_bytes, dumps

KINDS = ("vllm", "sglang")
SESSION_HEADER = "x-tracetap-session"
JSON_HEADERS = {"content-type": "application/json", "accept": "application/json"}
SSE_HEADERS = {"content-type": "application/json", "accept": "text/event-stream"}
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}
MAX_ERROR_BODY = 1024 * 1024  # an error answer read before a stream: kept whole up to this
LISTING_RETRY = 60.0  # seconds before asking again an upstream that answered without a model list
_META_TOKEN_KEYS = ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs",
                    "input_top_logprobs", "prompt_token_ids", "output_ids")
NO_CHOICES = "upstream sent no choices"
STREAMED = "upstream answered a non-streaming call with an SSE stream"
_PASSED_HEADERS = ("retry-after",)  # upstream error headers the caller gets too (when to retry a 429)
# UpstreamError kind -> error kind of the reply (else upstream_unreachable), and -> recorded status
_REPLY_KINDS = {"timeout": "timeout", "http": "upstream_error", "replay_miss": "not_found"}
_RECORDED_STATUS = {"timeout": "timeout", "replay_miss": "client_error"}  # else upstream_error

__all__ = ["ChatStream", "InvalidAnswer", "SSEStream", "TokenCapture", "Upstream", "UpstreamClient", "UpstreamError",
           "UpstreamResult", "fold_chat_stream", "parse_chat_response", "parse_chat_stream", "with_token_flags"]


class UpstreamError(Exception):
    """A failed upstream call. kind: timeout (504) | unreachable (502) | invalid (502) | http (its status)."""

    def __init__(self, kind: str, message: str, status: int, body: object = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.body = body  # the upstream's answer as it came (JSON value, or its text), kept in the record
        self.headers = headers or {}  # upstream headers to pass on to the caller (Retry-After)
        self.request: dict | None = None  # what was sent, when the call got that far
        self.engine: str | None = None  # base URL of the engine it was sent to
        self.metadata: dict = {}  # added to the record's metadata_json (replay provenance)

    @property
    def reply_kind(self) -> str:
        """The error kind the caller is answered with (capture/adapters/base.py ERROR_KINDS)."""
        return _REPLY_KINDS.get(self.kind, "upstream_unreachable")

    @property
    def recorded_status(self) -> str:
        """The status the call's completions row gets."""
        return _RECORDED_STATUS.get(self.kind, "upstream_error")


@dataclass
class TokenCapture:
    """What the store keeps of one upstream answer. `logprobs` is aligned with the sampled ids or None."""

    prompt_token_ids: list[int] | None
    completion_token_ids: list[int] | None
    logprobs: list[float] | None
    top_logprobs: list[list[dict]] | None
    finish_reason: str | None
    stop_reason: str | int | None
    tool_calls: list[dict]
    prompt_tokens: int | None
    completion_tokens: int | None
    body: dict = field(default_factory=dict)  # the answer without token arrays
    problems: list[str] = field(default_factory=list)  # why it is not training data: the call is `degraded`


@dataclass
class UpstreamResult:
    request: dict  # exactly what was sent
    body: dict     # vLLM-shaped answer, token arrays included
    capture: TokenCapture
    ms: float
    metadata: dict = field(default_factory=dict)  # added to the record's metadata_json (replay provenance)
    reply_as: tuple[str, int] | None = None  # (completion id, created) the reply shows; None: the call's own
    request_json: str | None = None  # `request` as the JSON text sent, when it was sent (stored as is)
    engine: str | None = None  # base URL of the engine that answered
    partial: bool = False  # a stream that ended before the upstream finished it (stopped, or failed)


class ChatStream(Protocol):
    """A streamed upstream chat call: vLLM `chat.completion.chunk` dicts as they arrive (the first carries
    `prompt_token_ids`; each choice its `token_ids` and `logprobs.content` aligned with them)."""

    def __aiter__(self) -> AsyncIterator[dict]: ...

    def result(self) -> UpstreamResult:
        """After iteration ended (fully, early, or by an UpstreamError): the folded answer, `partial` unless
        the upstream finished it. Raises UpstreamError (invalid) for token fields the store cannot hold."""
        ...

    async def aclose(self) -> None:
        """Stop early: the upstream connection is closed, so the engine aborts the request."""
        ...


class Upstream(Protocol):
    """What the gateway service calls: the live engine (`UpstreamClient`) or a recorded store
    (capture/replay.py `ReplayUpstream`). Used inside one event loop."""

    models: list[str]  # the names it serves, as far as known
    served_model: str | None  # the name other requested names map to
    @property
    def streams_tokens(self) -> bool:
        """Whether `chat_stream` works (else a streamed call is answered after the whole generation)."""
        ...

    async def discover(self) -> list[str]: ...

    async def resolve_model(self, requested: str | None) -> str | None: ...

    async def chat(self, chat_request: dict, session_id: str | None = None,
                   completion_id: str | None = None) -> UpstreamResult: ...

    async def chat_stream(self, chat_request: dict, session_id: str | None = None,
                          completion_id: str | None = None) -> ChatStream:
        """Raises UpstreamError when the upstream refuses before streaming (HTTP status, connect failure)."""
        ...

    async def tokenize(self, chat_request: dict) -> int: ...

    async def aclose(self) -> None: ...


def with_token_flags(chat_request: dict, kind: str = "vllm", stream: bool = False) -> dict:
    """The request as sent upstream, asking for prompt ids, sampled ids and logprobs: whole, or streamed
    with the usage on every chunk (so a stream stopped early still knows its counts).

    A client that asked for `top_logprobs: k` gets k alternatives; otherwise none are computed.
    """
    sent = {k: v for k, v in chat_request.items() if k != "stream_options"}
    asked = chat_request.get("logprobs") is True and fields.is_int(chat_request.get("top_logprobs"))
    top = chat_request["top_logprobs"] if asked else 0
    sent.update(stream=stream, logprobs=True, top_logprobs=top)
    if stream:
        sent["stream_options"] = dict(STREAM_OPTIONS)
    if kind == "sglang":
        sent.update(return_prompt_token_ids=True, return_meta_info=True)
    else:
        sent["return_token_ids"] = True
    return sent


def parse_chat_response(body: dict, kind: str = "vllm") -> TokenCapture:
    """Token data of a non-streaming chat answer, every field checked (capture/answer_fields.py).

    Raises InvalidAnswer when a field has a type the store cannot hold. An answer that is well typed
    but not training data (no ids, logprobs that do not line up) comes back with its `problems`.
    """
    body = sglang_to_vllm(body) if kind == "sglang" else body
    choices = fields.objects(body.get("choices"), "choices")
    choice = choices[0] if choices else {}
    message = fields.mapping(choice.get("message"), "choices[0].message")
    for name in ("content", "reasoning", "reasoning_content"):
        fields.text(message.get(name), f"choices[0].message.{name}")
    ids = fields.token_ids(choice.get("token_ids"), "choices[0].token_ids")
    prompt = fields.token_ids(body.get("prompt_token_ids"), "prompt_token_ids")
    entries = fields.mapping(choice.get("logprobs"), "choices[0].logprobs").get("content")
    logprobs, logprob_problem = fields.aligned_logprobs(entries, ids)
    usage = fields.usage(body.get("usage"))
    fields.text(body.get("model"), "model")
    return TokenCapture(
        prompt_token_ids=prompt, completion_token_ids=ids, logprobs=logprobs,
        top_logprobs=fields.top_logprobs(entries) if logprobs is not None else None,
        finish_reason=fields.text(choice.get("finish_reason"), "choices[0].finish_reason"),
        stop_reason=fields.stop_reason(choice.get("stop_reason")),
        tool_calls=fields.tool_calls(message.get("tool_calls")),
        prompt_tokens=fields.count(usage.get("prompt_tokens"), "usage.prompt_tokens"),
        completion_tokens=fields.count(usage.get("completion_tokens"), "usage.completion_tokens"),
        body=strip_token_arrays(body),
        problems=_problems(choices, prompt, ids, logprob_problem),
    )


def _problems(choices: list, prompt: list | None, ids: list | None, logprob_problem: str | None) -> list[str]:
    """Why a well-typed answer is still not training data (empty: it is)."""
    if not choices:
        return [NO_CHOICES]
    found = [] if ids is not None else ["upstream sent no completion token_ids"]
    found += [] if prompt is not None else ["upstream sent no prompt_token_ids"]
    return found + ([logprob_problem] if logprob_problem else [])


def parse_chat_stream(sse_text: str) -> TokenCapture:
    """Token data of a vLLM chat stream (the same fields a non-streaming call gives)."""
    return parse_chat_response(fold_chat_stream(sse_text))


def sglang_to_vllm(body: dict) -> dict:
    """SGLang's answer in vLLM's field names (reference-system §1.9).

    Prompt ids sit on the choice (or in `meta_info`); sampled ids and logprobs come from
    `meta_info.output_token_logprobs` = [[logprob, token_id, text], ...], which is complete even
    when `logprobs.content` is truncated. Raises InvalidAnswer when those fields are malformed.
    """
    try:
        return _sglang_fields(copy.deepcopy(body))
    except (TypeError, ValueError, IndexError, KeyError, AttributeError) as exc:
        raise InvalidAnswer(f"SGLang token fields are malformed: {exc}") from None


def _sglang_fields(out: dict) -> dict:
    choice = (out.get("choices") or [{}])[0]
    meta = choice.get("meta_info") or out.get("meta_info") or {}
    prompt = choice.pop("prompt_token_ids", None) or meta.get("prompt_token_ids")
    out["prompt_token_ids"] = out.get("prompt_token_ids") or prompt
    triples = meta.get("output_token_logprobs")
    if triples is not None:
        tops = meta.get("output_top_logprobs") or [[] for _ in triples]
        choice["token_ids"] = [int(t[1]) for t in triples]
        entries = [_sglang_entry(t, top) for t, top in zip(triples, tops, strict=False)]
        choice["logprobs"] = {"content": entries}
    message = choice.get("message") or {}
    if message.get("reasoning_content") and not message.get("reasoning"):
        message["reasoning"] = message["reasoning_content"]
    if isinstance(choice.get("meta_info"), dict):
        choice["meta_info"] = {k: v for k, v in choice["meta_info"].items() if k not in _META_TOKEN_KEYS}
    return out


def _sglang_entry(triple: list, top: list | None) -> dict:
    alternatives = [{"token": t[2] or "", "logprob": t[0], "token_id": int(t[1])} for t in top or []]
    return {"token": triple[2] or "", "logprob": triple[0], "token_id": int(triple[1]),
            "top_logprobs": alternatives}


def strip_token_arrays(body: dict) -> dict:
    """The answer without prompt ids, sampled ids and logprobs (those live in their own columns)."""
    out = {k: v for k, v in body.items() if k != "prompt_token_ids"}
    out["choices"] = [{k: v for k, v in c.items() if k not in ("token_ids", "logprobs")}
                      for c in body.get("choices") or []]
    return out


def error_message(body: object, fallback: str) -> str:
    """The message of an upstream error body in any of the shapes engines use."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if isinstance(body.get(key), str):
                return body[key]
    return fallback


class UpstreamClient:
    """A keep-alive connection pool to the engine. Create and use it inside one event loop."""

    def __init__(self, base_url: str, kind: str = "vllm", timeout: float = 600.0,
                 served_model: str | None = None, connect_timeout: float = 10.0):
        if kind not in KINDS:
            raise ValueError(f"unknown upstream kind {kind!r}; expected one of {', '.join(KINDS)}")
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.kind = kind
        self.timeout = timeout
        self.served_model = served_model
        self.models: list[str] = [served_model] if served_model else []
        self.max_model_len: int | None = None  # the served model's context, when `/v1/models` says
        self._pool = Pool(self.base_url, connect_timeout)
        self._unlisted_until = 0.0  # monotonic time before which `/v1/models` is not asked again

    @property
    def streams_tokens(self) -> bool:
        """vLLM (and the embedded engine) stream token ids and logprobs on every chunk; SGLang does not."""
        return self.kind == "vllm"

    async def discover(self) -> list[str]:
        """Learn the served model names from `/v1/models`; an unreachable upstream is not fatal here.

        An upstream that answers without a usable list is not asked again for LISTING_RETRY seconds
        (before, every call of `resolve_model` cost it one more round trip); an unreachable one is asked
        on the next call (an engine starting after the gateway)."""
        try:
            response = await self._pool.request("GET", "/v1/models", timeout=5.0)
        except (ConnectionError, TimeoutError):
            return self.models
        try:
            cards = json.loads(response.content)["data"]
            names = [m["id"] for m in cards if isinstance(m.get("id"), str)]
        except (ValueError, AttributeError, KeyError, TypeError):
            self._unlisted_until = time.monotonic() + LISTING_RETRY
            return self.models
        lengths = [m["max_model_len"] for m in cards if fields.is_int(m.get("max_model_len"))]
        self.max_model_len = self.max_model_len or (lengths[0] if lengths else None)
        self.models = list(dict.fromkeys(self.models + names))
        self.served_model = self.served_model or (names[0] if names else None)
        return self.models

    async def resolve_model(self, requested: str | None) -> str | None:
        """Names the upstream serves pass through; any other name maps to the served model."""
        if not self.models and time.monotonic() >= self._unlisted_until:
            await self.discover()
        if requested in self.models:
            return requested
        return self.served_model or requested

    async def chat(self, chat_request: dict, session_id: str | None = None,
                   completion_id: str | None = None) -> UpstreamResult:
        """One upstream call. Raises UpstreamError, also for an answer the gateway cannot use (502)."""
        sent = with_token_flags(chat_request, self.kind)
        headers = {SESSION_HEADER: session_id} if session_id else {}
        started = time.perf_counter()
        text = dumps(sent)  # encoded once: the body sent and the stored `chat_request_json`
        try:
            response = await self._post("/v1/chat/completions", text.encode("utf-8"), headers)
            result = _result(sent, response, self.kind)
        except UpstreamError as exc:
            exc.request, exc.engine = sent, self.base_url
            raise
        result.ms = (time.perf_counter() - started) * 1000
        result.request_json, result.engine = text, self.base_url
        return result

    async def chat_stream(self, chat_request: dict, session_id: str | None = None,
                          completion_id: str | None = None) -> LiveChatStream:
        """One streamed upstream call (see `ChatStream`). Raises UpstreamError before the stream starts."""
        sent = with_token_flags(chat_request, self.kind, stream=True)
        text = dumps(sent)
        started = time.perf_counter()
        try:
            events = await self.open_sse("/v1/chat/completions", text, session_id)
        except UpstreamError as exc:
            exc.request, exc.engine = sent, self.base_url
            raise
        return LiveChatStream(events, sent, text, started)

    async def open_sse(self, path: str, body_text: str, session_id: str | None = None) -> SSEStream:
        """POST a JSON body asking for an SSE answer: its JSON payloads as they arrive, until `[DONE]`.

        Raises UpstreamError for an HTTP error (or a body that is no stream) before the stream starts."""
        headers = {**SSE_HEADERS, **({SESSION_HEADER: session_id} if session_id else {})}
        try:
            async with asyncio.timeout(self.timeout):
                opened = await self._pool.open("POST", path, body_text.encode("utf-8"), headers)
                if opened.status >= 400 or "text/event-stream" not in opened.content_type:
                    await _refused(opened)
        except (TimeoutError, ConnectionError) as exc:
            raise transport_error(self.base_url, exc) from exc
        return SSEStream(opened, self.base_url, self.timeout)

    async def healthy(self) -> bool:
        """Whether the engine answers `GET /health` with a 200 (vLLM and SGLang both serve it)."""
        try:
            return (await self._pool.request("GET", "/health", timeout=5.0)).status == 200
        except (ConnectionError, TimeoutError):
            return False

    async def tokenize(self, chat_request: dict) -> int:
        """Prompt length of a chat request, generation prompt included (vLLM `/tokenize`)."""
        keys = ("model", "messages", "tools", "chat_template_kwargs")
        payload = {k: chat_request[k] for k in keys if k in chat_request}
        payload["add_generation_prompt"] = True
        response = await self._post("/tokenize", dump_bytes(payload), {})
        try:
            return fields.count(_decode(response)[0].get("count"), "count") or 0
        except InvalidAnswer as exc:
            raise UpstreamError("invalid", f"the upstream's token count is unusable: {exc}", 502,
                                _raw(response)) from None

    async def post_json(self, path: str, text: str, session_id: str | None = None) -> dict:
        """POST a JSON body; the answer as a JSON object (HTTP errors raise UpstreamError)."""
        headers = {SESSION_HEADER: session_id} if session_id else {}
        return _decode(await self._post(path, text.encode("utf-8"), headers))[0]

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def _post(self, path: str, body: bytes, headers: dict) -> Response:
        try:
            return await self._pool.request("POST", path, body, {**JSON_HEADERS, **headers}, self.timeout)
        except (TimeoutError, ConnectionError) as exc:
            raise transport_error(self.base_url, exc) from exc


def transport_error(engine: str, exc: TimeoutError | ConnectionError) -> UpstreamError:
    """A timeout or a connection failure as the UpstreamError the caller is answered with."""
    if isinstance(exc, TimeoutError):
        return UpstreamError("timeout", f"upstream {engine} timed out", 504)
    return UpstreamError("unreachable", f"upstream {engine} unreachable: {exc}", 502)


async def _refused(opened: Opened) -> None:
    """An answer to a streamed call that is no stream: its HTTP error, or an `invalid` one; always raises."""
    content = b""
    while len(content) < MAX_ERROR_BODY and (data := await opened.read()) is not None:
        content += data
    opened.close()
    response = Response(opened.status, opened.headers, content)
    _decode(response)  # raises UpstreamError for an HTTP error status
    raise UpstreamError("invalid", "upstream answered a streaming call without an SSE stream", 502, _raw(response))


class SSEStream:
    """The JSON payloads of an upstream SSE answer as they arrive, until `[DONE]` (`finished` then).

    Each read waits at most `idle_timeout`; a failure mid-stream is an UpstreamError (an error payload the
    upstream sent in the stream is an `http` one with its code)."""

    def __init__(self, opened: Opened, engine: str, idle_timeout: float):
        self.engine = engine
        self.finished = False
        self._opened, self._idle_timeout = opened, idle_timeout
        self._decoder = sse.SSEDecoder()
        self._ready: deque[str] = deque()

    def __aiter__(self) -> SSEStream:
        return self

    async def __anext__(self) -> dict:
        data = await self._next_data()
        if data == sse.DONE:
            self.finished = True
            await self._drain()
            raise StopAsyncIteration
        return _stream_payload(data)

    async def aclose(self) -> None:
        """Stop reading; a stream not at its end closes its connection (the engine aborts the request)."""
        self._opened.close()

    async def _next_data(self) -> str:
        while not self._ready:
            if self._opened.done:
                raise UpstreamError("unreachable", f"upstream {self.engine} ended its stream before [DONE]", 502)
            try:
                async with asyncio.timeout(self._idle_timeout):
                    data = await self._opened.read()
            except (TimeoutError, ConnectionError) as exc:
                raise transport_error(self.engine, exc) from exc
            self._ready.extend(self._decoded(data))
        return self._ready.popleft()

    def _decoded(self, data: bytes | None) -> list[str]:
        try:
            return self._decoder.feed(data) if data is not None else self._decoder.finish()
        except sse.SSEError as exc:
            self._opened.close()
            raise UpstreamError("invalid", f"upstream {self.engine} sent a malformed stream: {exc}", 502) from None

    async def _drain(self) -> None:
        """Read past `[DONE]` to the end of the body, so the connection can serve the next call."""
        try:
            async with asyncio.timeout(self._idle_timeout):
                while await self._opened.read() is not None:
                    pass
        except (TimeoutError, ConnectionError):
            self._opened.close()


def _stream_payload(data: str) -> dict:
    try:
        payload = parse_body(data.encode("utf-8", "surrogateescape"))
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        raise UpstreamError("invalid", "upstream sent a stream event that is not a JSON object", 502, data[:2000])
    if "error" in payload and "choices" not in payload:
        error = payload["error"]
        code = error.get("code") if isinstance(error, dict) else None
        status = code if fields.is_int(code) and 400 <= code < 600 else 502
        raise UpstreamError("http", error_message(payload, "upstream failed mid-stream"), status, payload)
    return payload


class ChunkSource(Protocol):
    """What a LiveChatStream reads: chat chunks as they arrive (an SSEStream, or the gateway-tokenized
    stream of capture/tokenized_stream.py)."""

    @property
    def engine(self) -> str: ...

    @property
    def finished(self) -> bool: ...

    async def __anext__(self) -> dict: ...

    async def aclose(self) -> None: ...


class LiveChatStream:
    """`ChatStream` over an upstream SSE answer: each chunk is folded (capture/chat_fold.py) as it passes."""

    def __init__(self, events: ChunkSource, sent: dict, request_json: str, started: float):
        self.metadata: dict = {}  # added to the result's metadata (an engine pool's move)
        self._events, self._sent, self._request_json, self._started = events, sent, request_json, started
        self._fold = ChatFold()

    def __aiter__(self) -> LiveChatStream:
        return self

    async def __anext__(self) -> dict:
        try:
            chunk = await self._events.__anext__()
            self._fold.add(chunk)
        except UpstreamError as exc:
            exc.request, exc.engine = self._sent, self._events.engine
            raise
        except (TypeError, AttributeError, ValueError) as exc:
            raise UpstreamError("invalid", f"upstream sent a malformed stream chunk: {exc}", 502) from None
        return chunk

    def result(self) -> UpstreamResult:
        body = self._fold.body()
        try:
            capture = parse_chat_response(body)
        except InvalidAnswer as exc:
            raise UpstreamError("invalid", f"the upstream's answer is unusable: {exc}", 502, body) from None
        ms = (time.perf_counter() - self._started) * 1000
        return UpstreamResult(self._sent, body, capture, ms, dict(self.metadata), request_json=self._request_json,
                              engine=self._events.engine, partial=not self._events.finished)

    async def aclose(self) -> None:
        await self._events.aclose()


def _result(sent: dict, response: Response, kind: str) -> UpstreamResult:
    """The parsed answer; one the gateway cannot use is an `invalid` UpstreamError keeping the raw body."""
    body, streamed = _decode(response)
    try:
        vllm_body = sglang_to_vllm(body) if kind == "sglang" else body
        capture = parse_chat_response(vllm_body)
    except InvalidAnswer as exc:
        raise UpstreamError("invalid", f"the upstream's answer is unusable: {exc}", 502, _raw(response)) from None
    if streamed:
        capture.problems.insert(0, STREAMED)
    return UpstreamResult(sent, vllm_body, capture, 0.0)


def _decode(response: Response) -> tuple[dict, bool]:
    """(the answer as a JSON object, whether it came as an SSE stream, then folded).

    HTTP errors raise UpstreamError with the upstream's status and its Retry-After."""
    try:
        body = parse_body(response.content) if response.content else None  # strict: no NaN, bounded
    except ValueError:
        body = None
    streamed = body is None and _is_stream(response)
    if streamed:
        body = _folded(response)
    if response.status >= 400:
        text = response.content.decode("utf-8", "surrogateescape")[:2000]
        parsed = body if isinstance(body, dict) else {"error": {"message": text}}
        message = error_message(parsed, f"upstream answered HTTP {response.status}")
        passed = {name: response.headers[name] for name in _PASSED_HEADERS if name in response.headers}
        raise UpstreamError("http", message, response.status, parsed, passed)
    if not isinstance(body, dict):
        raise UpstreamError("invalid", "upstream answered with a body that is not a JSON object", 502,
                            _raw(response))
    return body, streamed


def _is_stream(response: Response) -> bool:
    return "text/event-stream" in response.content_type or response.content.lstrip().startswith(b"data:")


def _folded(response: Response) -> dict:
    try:
        return fold_chat_stream(response.content.decode("utf-8", "surrogateescape"))
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise UpstreamError("invalid", f"upstream answered with a malformed SSE stream: {exc}", 502,
                            _raw(response)) from None


def _raw(response: Response) -> object:
    """The upstream's body as it came: its JSON value, else its text (kept in the failed call's record)."""
    try:
        return json.loads(response.content)
    except ValueError:
        return response.content.decode("utf-8", "surrogateescape")
