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
from tracetap.capture.adapters.stream_pieces import REASONING, TEXT, Piece, pieces, replayed
from tracetap.capture.jsontext import dumps

__all__ = [
    "API", "to_chat_request", "from_chat_response", "to_sse_events", "error_body", "error_event",
    "count_tokens_body", "model_body", "models_body", "translator",
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
    return replayed(translator(ctx), chat)


def translator(ctx: RequestContext) -> ContentStream:
    return ContentStream(ctx)


class ContentStream:
    """One frame per thought or text piece, sent when the next piece arrives: the last one (when the
    answer has no function calls) rides in the terminal frame with finishReason and usageMetadata."""

    def __init__(self, ctx: RequestContext):
        self.ctx = ctx
        self.thoughts = _wants_thoughts(ctx)
        self.held: dict | None = None  # the latest thought or text part, not sent yet

    def events(self, chunk: dict) -> list[bytes]:
        frames = []
        for piece in pieces(chunk):
            part = _part(piece, self.thoughts)
            if part is not None:
                frames += self._flush()
                self.held = part
        return frames

    def closing(self, chat: dict) -> list[bytes]:
        return self._flush() if _calls(chat) else []

    def terminal(self, chat: dict) -> list[bytes]:
        parts = _calls(chat) or ([self.held] if self.held else [{"text": ""}])
        return [_frame(_chunk(parts, self.ctx, chat, final=True))]

    def error(self, status: int, message: str, kind: str) -> list[bytes]:
        return [error_event(status, message, kind)]

    def _flush(self) -> list[bytes]:
        held, self.held = self.held, None
        return [_frame(_chunk([held], self.ctx, {}, final=False))] if held else []


def _part(piece: Piece, thoughts: bool) -> dict | None:
    if piece.kind == TEXT:
        return {"text": piece.text}
    return {"text": piece.text, "thought": True} if piece.kind == REASONING and thoughts else None


def _frame(chunk: dict) -> bytes:
    return sse_frame(_one_line_json(chunk))


def _parts(chat: dict, ctx: RequestContext) -> list[dict]:
    """Thought, text, then one functionCall part per tool call (always with its id)."""
    message = first_choice(chat).get("message") or {}
    parts: list[dict] = []
    thought = reasoning_text(message)
    if thought and _wants_thoughts(ctx):
        parts.append({"text": thought, "thought": True})
    if isinstance(text := message.get("content"), str) and text:
        parts.append({"text": text})
    return parts + _calls(chat) or [{"text": ""}]


def _calls(chat: dict) -> list[dict]:
    """One functionCall part per tool call of the answer."""
    calls = (first_choice(chat).get("message") or {}).get("tool_calls") or []
    return [_call_part(call.get("function") or {}, call.get("id")) for call in calls]


def _call_part(function: dict, call_id: str | None) -> dict:
    args = arguments_object(function.get("arguments"))
    return {"functionCall": {"id": call_id, "name": function.get("name"), "args": args}}


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
