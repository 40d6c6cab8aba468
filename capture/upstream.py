"""The upstream engine client (vLLM, SGLang, the embedded engine) and the pure parsers of its answers.

The gateway always calls `/v1/chat/completions` non-streaming and asks for token data, over a
keep-alive pool (capture/http1.py). Parsing is pure and kept apart from I/O so real vLLM bodies
(fixtures) and live answers go through one path:
`parse_chat_response(body) -> TokenCapture`, `parse_chat_stream(sse_text) -> TokenCapture`.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from typing import Protocol

from tracetap.capture import answer_fields as fields
from tracetap.capture.answer_fields import InvalidAnswer
from tracetap.capture.http1 import Pool, Response
from tracetap.capture.json_body import parse_body
from tracetap.capture.jsontext import dump_bytes, dumps

KINDS = ("vllm", "sglang")
SESSION_HEADER = "x-tracetap-session"
JSON_HEADERS = {"content-type": "application/json", "accept": "application/json"}
_META_TOKEN_KEYS = ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs",
                    "input_top_logprobs", "prompt_token_ids", "output_ids")
NO_CHOICES = "upstream sent no choices"
STREAMED = "upstream answered a non-streaming call with an SSE stream"
_PASSED_HEADERS = ("retry-after",)  # upstream error headers the caller gets too (when to retry a 429)

__all__ = ["InvalidAnswer", "TokenCapture", "Upstream", "UpstreamClient", "UpstreamError", "UpstreamResult",
           "parse_chat_response", "parse_chat_stream", "with_token_flags"]


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


class Upstream(Protocol):
    """What the gateway service calls: the live engine (`UpstreamClient`) or a recorded store
    (capture/replay.py `ReplayUpstream`). Used inside one event loop."""

    models: list[str]  # the names it serves, as far as known
    served_model: str | None  # the name other requested names map to

    async def discover(self) -> list[str]: ...

    async def resolve_model(self, requested: str | None) -> str | None: ...

    async def chat(self, chat_request: dict, session_id: str | None = None,
                   completion_id: str | None = None) -> UpstreamResult: ...

    async def tokenize(self, chat_request: dict) -> int: ...

    async def aclose(self) -> None: ...


def with_token_flags(chat_request: dict, kind: str = "vllm") -> dict:
    """The request as sent upstream: non-streaming, asking for prompt ids, sampled ids and logprobs.

    A client that asked for `top_logprobs: k` gets k alternatives; otherwise none are computed.
    """
    sent = {k: v for k, v in chat_request.items() if k != "stream_options"}
    asked = chat_request.get("logprobs") is True and fields.is_int(chat_request.get("top_logprobs"))
    top = chat_request["top_logprobs"] if asked else 0
    sent.update(stream=False, logprobs=True, top_logprobs=top)
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


def fold_chat_stream(sse_text: str) -> dict:
    """Fold vLLM stream chunks into the body a non-streaming call would have returned.

    Prompt ids come on the first chunk only; every later chunk may carry `token_ids` and logprobs,
    even when its delta is empty.
    """
    folded: dict = {"object": "chat.completion", "choices": []}
    choice: dict = {"index": 0, "message": {"role": "assistant", "content": None}, "logprobs": None,
              "finish_reason": None, "stop_reason": None, "token_ids": None}
    calls: dict[int, dict] = {}
    for chunk in _sse_payloads(sse_text):
        _fold_chunk(folded, choice, calls, chunk)
    if calls:
        choice["message"]["tool_calls"] = [calls[i] for i in sorted(calls)]
    folded["choices"] = [choice]
    return folded


def _sse_payloads(sse_text: str):
    for line in sse_text.splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data and data != "[DONE]":
                yield json.loads(data)


def _fold_chunk(folded: dict, choice: dict, calls: dict[int, dict], chunk: dict) -> None:
    for key in ("id", "created", "model", "system_fingerprint", "usage", "prompt_token_ids"):
        if chunk.get(key) is not None and (key != "prompt_token_ids" or key not in folded):
            folded[key] = chunk[key]
    for part in chunk.get("choices") or []:
        if part.get("index", 0) != 0:
            continue
        _fold_delta(choice["message"], calls, part.get("delta") or {})
        if part.get("token_ids") is not None:
            choice["token_ids"] = (choice["token_ids"] or []) + list(part["token_ids"])
        if (part.get("logprobs") or {}).get("content") is not None:
            choice["logprobs"] = choice["logprobs"] or {"content": []}
            choice["logprobs"]["content"] += part["logprobs"]["content"]
        for key in ("finish_reason", "stop_reason"):
            if part.get(key) is not None:
                choice[key] = part[key]


def _fold_delta(message: dict, calls: dict[int, dict], delta: dict) -> None:
    for key in ("content", "reasoning", "reasoning_content"):
        if isinstance(delta.get(key), str):
            message[key] = (message.get(key) or "") + delta[key]
    for call in delta.get("tool_calls") or []:
        slot = calls.setdefault(call.get("index", 0), {"id": None, "type": "function",
                                                       "function": {"name": None, "arguments": ""}})
        slot["id"] = call.get("id") or slot["id"]
        function = call.get("function") or {}
        slot["function"]["name"] = function.get("name") or slot["function"]["name"]
        slot["function"]["arguments"] += function.get("arguments") or ""


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

    async def discover(self) -> list[str]:
        """Learn the served model names from `/v1/models`; an unreachable upstream is not fatal here."""
        try:
            response = await self._pool.request("GET", "/v1/models", timeout=5.0)
            cards = json.loads(response.content)["data"]
            names = [m["id"] for m in cards if isinstance(m.get("id"), str)]
        except (ConnectionError, TimeoutError, ValueError, AttributeError, KeyError, TypeError):
            return self.models
        lengths = [m["max_model_len"] for m in cards if fields.is_int(m.get("max_model_len"))]
        self.max_model_len = self.max_model_len or (lengths[0] if lengths else None)
        self.models = list(dict.fromkeys(self.models + names))
        self.served_model = self.served_model or (names[0] if names else None)
        return self.models

    async def resolve_model(self, requested: str | None) -> str | None:
        """Names the upstream serves pass through; any other name maps to the served model."""
        if not self.models:
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
        except TimeoutError as exc:
            raise UpstreamError("timeout", f"upstream {self.base_url} timed out", 504) from exc
        except ConnectionError as exc:
            raise UpstreamError("unreachable", f"upstream {self.base_url} unreachable: {exc}", 502) from exc


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
