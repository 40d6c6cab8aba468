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

from tracetap.capture.http1 import Pool, Response

KINDS = ("vllm", "sglang")
SESSION_HEADER = "x-tracetap-session"
JSON_HEADERS = {"content-type": "application/json", "accept": "application/json"}
_META_TOKEN_KEYS = ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs",
                    "input_top_logprobs", "prompt_token_ids", "output_ids")


class UpstreamError(Exception):
    """A failed upstream call. kind: timeout (504) | unreachable (502) | invalid (502) | http (its status)."""

    def __init__(self, kind: str, message: str, status: int, body: dict | None = None):
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.body = body
        self.request: dict | None = None  # what was sent, when the call got that far
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


@dataclass
class UpstreamResult:
    request: dict  # exactly what was sent
    body: dict     # vLLM-shaped answer, token arrays included
    capture: TokenCapture
    ms: float
    metadata: dict = field(default_factory=dict)  # added to the record's metadata_json (replay provenance)
    reply_as: tuple[str, int] | None = None  # (completion id, created) the reply shows; None: the call's own


def with_token_flags(chat_request: dict, kind: str = "vllm") -> dict:
    """The request as sent upstream: non-streaming, asking for prompt ids, sampled ids and logprobs.

    A client that asked for `top_logprobs: k` gets k alternatives; otherwise none are computed.
    """
    sent = {k: v for k, v in chat_request.items() if k != "stream_options"}
    asked = chat_request.get("logprobs") is True and _is_int(chat_request.get("top_logprobs"))
    top = chat_request["top_logprobs"] if asked else 0
    sent.update(stream=False, logprobs=True, top_logprobs=top)
    if kind == "sglang":
        sent.update(return_prompt_token_ids=True, return_meta_info=True)
    else:
        sent["return_token_ids"] = True
    return sent


def parse_chat_response(body: dict, kind: str = "vllm") -> TokenCapture:
    """Token data of a non-streaming chat answer; never a partly filled logprob list."""
    body = sglang_to_vllm(body) if kind == "sglang" else body
    choice = (body.get("choices") or [{}])[0]
    ids = _int_list(choice.get("token_ids"))
    entries = (choice.get("logprobs") or {}).get("content")
    usage = body.get("usage") or {}
    return TokenCapture(
        prompt_token_ids=_int_list(body.get("prompt_token_ids")),
        completion_token_ids=ids,
        logprobs=_aligned_logprobs(entries, ids),
        top_logprobs=_aligned_top(entries, ids),
        finish_reason=choice.get("finish_reason"),
        stop_reason=choice.get("stop_reason"),
        tool_calls=_tool_calls((choice.get("message") or {}).get("tool_calls")),
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        body=strip_token_arrays(body),
    )


def parse_chat_stream(sse_text: str) -> TokenCapture:
    """Token data of a vLLM chat stream (the same fields a non-streaming call gives)."""
    return parse_chat_response(fold_chat_stream(sse_text))


def fold_chat_stream(sse_text: str) -> dict:
    """Fold vLLM stream chunks into the body a non-streaming call would have returned.

    Prompt ids come on the first chunk only; every later chunk may carry `token_ids` and logprobs,
    even when its delta is empty.
    """
    folded: dict = {"object": "chat.completion", "choices": []}
    choice = {"index": 0, "message": {"role": "assistant", "content": None}, "logprobs": None,
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
    when `logprobs.content` is truncated.
    """
    out = copy.deepcopy(body)
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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(value: object) -> list[int] | None:
    return [int(v) for v in value] if isinstance(value, list) else None


def _aligned_logprobs(entries: object, ids: list[int] | None) -> list[float] | None:
    if not isinstance(entries, list) or ids is None or len(entries) != len(ids):
        return None
    values = [e.get("logprob") if isinstance(e, dict) else None for e in entries]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return None
    return [float(v) for v in values]


def _aligned_top(entries: object, ids: list[int] | None) -> list[list[dict]] | None:
    if _aligned_logprobs(entries, ids) is None or not any(e.get("top_logprobs") for e in entries):
        return None
    return [[_top_entry(t) for t in e.get("top_logprobs") or []] for e in entries]


def _top_entry(top: dict) -> dict:
    token = top.get("token")
    token_id = top.get("token_id")
    if token_id is None and isinstance(token, str) and token.startswith("token_id:"):
        token_id = int(token.removeprefix("token_id:"))
    return {"token_id": token_id, "token": token, "logprob": top.get("logprob")}


def _tool_calls(calls: object) -> list[dict]:
    out = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str) and arguments is not None:
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append({"id": call.get("id"), "name": function.get("name"), "arguments": arguments})
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
        self._pool = Pool(self.base_url, connect_timeout)

    async def discover(self) -> list[str]:
        """Learn the served model names from `/v1/models`; an unreachable upstream is not fatal here."""
        try:
            response = await self._pool.request("GET", "/v1/models", timeout=5.0)
            names = [m["id"] for m in json.loads(response.content)["data"] if isinstance(m.get("id"), str)]
        except (ConnectionError, TimeoutError, ValueError, AttributeError, KeyError, TypeError):
            return self.models
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

    async def chat(self, chat_request: dict, session_id: str | None = None) -> UpstreamResult:
        sent = with_token_flags(chat_request, self.kind)
        headers = {SESSION_HEADER: session_id} if session_id else {}
        started = time.perf_counter()
        try:
            body = _decode(await self._post("/v1/chat/completions", sent, headers))
        except UpstreamError as exc:
            exc.request = sent
            raise
        ms = (time.perf_counter() - started) * 1000
        vllm_body = sglang_to_vllm(body) if self.kind == "sglang" else body
        return UpstreamResult(sent, vllm_body, parse_chat_response(vllm_body), ms)

    async def tokenize(self, chat_request: dict) -> int:
        """Prompt length of a chat request, generation prompt included (vLLM `/tokenize`)."""
        keys = ("model", "messages", "tools", "chat_template_kwargs")
        payload = {k: chat_request[k] for k in keys if k in chat_request}
        payload["add_generation_prompt"] = True
        return int(_decode(await self._post("/tokenize", payload, {})).get("count", 0))

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def _post(self, path: str, payload: dict, headers: dict) -> Response:
        body = json.dumps(payload, ensure_ascii=False).encode()
        try:
            return await self._pool.request("POST", path, body, {**JSON_HEADERS, **headers}, self.timeout)
        except TimeoutError as exc:
            raise UpstreamError("timeout", f"upstream {self.base_url} timed out", 504) from exc
        except ConnectionError as exc:
            raise UpstreamError("unreachable", f"upstream {self.base_url} unreachable: {exc}", 502) from exc


def _decode(response: Response) -> dict:
    """The answer as a JSON object (a streamed answer is folded); HTTP errors raise UpstreamError."""
    try:
        body = json.loads(response.content) if response.content else None
    except ValueError:
        body = None
    if body is None and "text/event-stream" in response.content_type:
        body = fold_chat_stream(response.content.decode("utf-8", "replace"))
    if response.status >= 400:
        text = response.content.decode("utf-8", "replace")[:2000]
        parsed = body if isinstance(body, dict) else {"error": {"message": text}}
        message = error_message(parsed, f"upstream answered HTTP {response.status}")
        raise UpstreamError("http", message, response.status, parsed)
    if not isinstance(body, dict):
        raise UpstreamError("invalid", "upstream answered with a body that is not a JSON object", 502)
    return body
