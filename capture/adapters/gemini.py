"""Google Gemini generateContent <-> Chat Completions (protocols.md §2.3, §3.5, §3.6, §4.4).

Pure functions, no I/O. Gemini names the model in the URL path: the caller passes it as
`ctx.requested_model`, and it is echoed back as `modelVersion`. The request side lives in
`gemini_request`; this module is the adapter entry point and the response side.

Thought parts are sent back when the harness asked for them. Pass the harness's body as
`ctx.extra["request"]` to honour `thinkingConfig.includeThoughts`; without it, reasoning the model
produced is always returned as a thought part (the SDKs keep thought parts out of `.text`).
"""

from __future__ import annotations

from tracetap.capture.adapters.base import RequestContext, first_choice, reasoning_text, request_body, sse_frame
from tracetap.capture.adapters.chat_parts import arguments_object, usage_of
from tracetap.capture.adapters.gemini_request import include_thoughts, to_chat_request
from tracetap.capture.jsontext import dumps

__all__ = [
    "API", "to_chat_request", "from_chat_response", "to_sse_events", "error_body", "error_event",
    "count_tokens_body", "model_body", "models_body",
]

API = "gemini"

_FINISH_REASONS: dict[str | None, str] = {  # else STOP
    "length": "MAX_TOKENS", "content_filter": "SAFETY", "abort": "OTHER"}
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
    500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}
_KIND_NAMES = {
    "invalid_request": "INVALID_ARGUMENT", "not_found": "NOT_FOUND", "payload_too_large": "INVALID_ARGUMENT",
    "timeout": "DEADLINE_EXCEEDED", "upstream_unreachable": "UNAVAILABLE", "internal": "INTERNAL",
}
# Characters JSON leaves unescaped that some SSE readers (JS regexes, str.splitlines) take for line breaks.
_LINE_BREAKS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def from_chat_response(chat: dict, ctx: RequestContext) -> dict:
    """The GenerateContentResponse for a complete chat response."""
    return _chunk(_parts(chat, ctx), ctx, chat, final=True)


def to_sse_events(chat: dict, ctx: RequestContext) -> list[bytes]:
    """`data:` frames only (no `event:` lines, no comments): one per thought or text part, then the
    function calls together in the last frame, which also carries finishReason and usageMetadata."""
    parts = _parts(chat, ctx)
    head = [part for part in parts if "functionCall" not in part]
    last = [part for part in parts if "functionCall" in part]
    if not last:
        head, last = head[:-1], head[-1:]
    chunks = [_chunk([part], ctx, chat, final=False) for part in head]
    chunks.append(_chunk(last, ctx, chat, final=True))
    return [sse_frame(_one_line_json(chunk)) for chunk in chunks]


def _parts(chat: dict, ctx: RequestContext) -> list[dict]:
    """Thought, text, then one functionCall part per tool call (always with its id)."""
    message = first_choice(chat).get("message") or {}
    parts: list[dict] = []
    thought = reasoning_text(message)
    if thought and _wants_thoughts(ctx):
        parts.append({"text": thought, "thought": True})
    if isinstance(text := message.get("content"), str) and text:
        parts.append({"text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        args = arguments_object(function.get("arguments"))
        parts.append({"functionCall": {"id": call.get("id"), "name": function.get("name"), "args": args}})
    return parts or [{"text": ""}]


def _wants_thoughts(ctx: RequestContext) -> bool:
    request = request_body(ctx)  # {} only when the caller passed no body: an accepted one has contents
    return include_thoughts(request) if request else True


def _chunk(parts: list[dict], ctx: RequestContext, chat: dict, final: bool) -> dict:
    candidate: dict = {"content": {"role": "model", "parts": parts}, "index": 0}
    body: dict = {"candidates": [candidate]}
    if final:
        candidate["finishReason"] = _FINISH_REASONS.get(first_choice(chat).get("finish_reason"), "STOP")
        body["usageMetadata"] = _usage(chat)
    body["modelVersion"] = ctx.requested_model
    body["responseId"] = ctx.completion_id
    return body


def _usage(chat: dict) -> dict:
    """Gemini counts thoughts apart from candidates; zero thought and cache counts are left out."""
    usage = usage_of(chat)
    meta = {"promptTokenCount": usage.prompt, "candidatesTokenCount": usage.completion - usage.reasoning}
    if usage.reasoning:
        meta["thoughtsTokenCount"] = usage.reasoning
    if usage.cached:
        meta["cachedContentTokenCount"] = usage.cached
    meta["totalTokenCount"] = usage.prompt + usage.completion
    return meta


def _one_line_json(obj: dict) -> str:
    text = dumps(obj)
    for char, escape in _LINE_BREAKS.items():
        text = text.replace(char, escape)
    return text


def error_body(status: int, message: str, kind: str = "internal") -> dict:
    """Google's error envelope; the status name follows the HTTP status, then the error kind."""
    name = _STATUS_NAMES.get(status) or _KIND_NAMES.get(kind)
    name = name or ("INVALID_ARGUMENT" if 400 <= status < 500 else "INTERNAL")
    return {"error": {"code": status, "message": message, "status": name}}


def error_event(status: int, message: str, kind: str = "internal") -> bytes:
    """The in-stream form of `error_body`: a bare `data:` frame, which the SDKs raise on."""
    return sse_frame(_one_line_json(error_body(status, message, kind)))


def count_tokens_body(n: int) -> dict:
    return {"totalTokens": n}


def model_body(name: str, input_token_limit: int = 131072, output_token_limit: int = 32768) -> dict:
    """One model as `GET /{ver}/models/{model}` returns it (and as `models_body` lists it)."""
    return {
        "name": f"models/{name}",
        "displayName": name,
        "inputTokenLimit": input_token_limit,
        "outputTokenLimit": output_token_limit,
        "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens"],
    }


def models_body(served_model_names: list[str], input_token_limit: int = 131072) -> dict:
    """`GET /{ver}/models`: the served models under Gemini's list shape."""
    return {"models": [model_body(name, input_token_limit) for name in served_model_names]}
