"""Anthropic Messages <-> Chat Completions (protocols.md §2.1, §3.1-3.3, §3.6, §4.2).

Pure functions, no I/O. The request side lives in `anthropic_request`; this module is the adapter
entry point and the response side: the complete upstream chat response becomes an Anthropic
Message, or the SSE event sequence the official SDK's stream helper accepts.
"""

from __future__ import annotations

import json
import re

from tracetap.capture.adapters.anthropic_request import to_chat_request
from tracetap.capture.adapters.base import RequestContext, first_choice, reasoning_text, sse_frame
from tracetap.capture.adapters.chat_parts import (
    arguments_object,
    matched_stop,
    stable_hex,
    synthetic_signature,
    usage_of,
)

__all__ = ["API", "count_tokens_body", "error_body", "error_event", "from_chat_response", "to_chat_request",
           "to_sse_events"]

API = "anthropic_messages"

_TOOL_USE_ID = re.compile(r"toolu_[A-Za-z0-9_-]+")
_CONTEXT_OVERFLOW = re.compile(r"maximum context length|context window|too many tokens", re.IGNORECASE)
_KIND_TYPES = {
    "invalid_request": "invalid_request_error",
    "not_found": "not_found_error",
    "payload_too_large": "request_too_large",
    "timeout": "timeout_error",
    "upstream_unreachable": "api_error",
    "unavailable": "overloaded_error",
    "internal": "api_error",
}
_STATUS_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
    429: "rate_limit_error", 504: "timeout_error", 529: "overloaded_error",
}


def from_chat_response(chat: dict, ctx: RequestContext) -> dict:
    """The Anthropic Message for a complete upstream chat response."""
    choice = first_choice(chat)
    message = choice.get("message") or {}
    stop_reason, stop_sequence = _stop(choice, message)
    return {
        "id": "msg_" + stable_hex(ctx.completion_id),
        "type": "message",
        "role": "assistant",
        "model": ctx.requested_model,
        "content": _content(message, ctx.completion_id),
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(chat),
    }


def _content(message: dict, completion_id: str) -> list[dict]:
    """thinking?, text?, tool_use...; never empty (an empty answer is one empty text block)."""
    blocks: list[dict] = []
    if reasoning := reasoning_text(message):
        signature = synthetic_signature(reasoning)
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": signature})
    if isinstance(text := message.get("content"), str) and text:
        blocks.append({"type": "text", "text": text})
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        blocks.append({
            "type": "tool_use",
            "id": _tool_use_id(call.get("id"), completion_id, index),
            "name": function.get("name") or "",
            "input": arguments_object(function.get("arguments")),
        })
    return blocks or [{"type": "text", "text": ""}]


def _tool_use_id(upstream: object, completion_id: str, index: int) -> str:
    """The upstream call id, made to look like `toolu_…` when it does not already."""
    if not isinstance(upstream, str) or not upstream:
        return "toolu_" + stable_hex(completion_id, index)
    if _TOOL_USE_ID.fullmatch(upstream):
        return upstream
    return "toolu_" + re.sub(r"[^A-Za-z0-9_-]", "_", upstream)


def _stop(choice: dict, message: dict) -> tuple[str, str | None]:
    finish = choice.get("finish_reason")
    if finish == "length":
        return "max_tokens", None
    if finish == "tool_calls" or message.get("tool_calls"):
        return "tool_use", None
    if finish == "content_filter":
        return "refusal", None
    if (stop := matched_stop(choice)) is not None:
        return "stop_sequence", stop
    return "end_turn", None


def _usage(chat: dict) -> dict:
    """Anthropic's input_tokens exclude cache reads: the three input fields sum to the prompt."""
    usage = usage_of(chat)
    return {
        "input_tokens": usage.prompt - usage.cached,
        "output_tokens": usage.completion,
        "cache_read_input_tokens": usage.cached,
        "cache_creation_input_tokens": 0,
    }


def to_sse_events(chat: dict, ctx: RequestContext) -> list[bytes]:
    """message_start, then start/deltas/stop per block (indexes 0..n-1), message_delta, message_stop."""
    message = from_chat_response(chat, ctx)
    opening = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {**message["usage"], "output_tokens": 0}}
    events = [_event("message_start", message=opening)]
    for index, block in enumerate(message["content"]):
        events += _block_events(index, block)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    events.append(_event("message_delta", delta=delta, usage=message["usage"]))
    events.append(_event("message_stop"))
    return events


def _event(kind: str, **fields: object) -> bytes:
    return sse_frame({"type": kind, **fields}, event=kind)


def _block_events(index: int, block: dict) -> list[bytes]:
    """One block as start (empty), its deltas, stop; a thinking block ends with its signature."""
    if block["type"] == "thinking":
        empty: dict = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                  {"type": "signature_delta", "signature": block["signature"]}]
    elif block["type"] == "tool_use":
        empty = {**block, "input": {}}
        partial = json.dumps(block["input"], ensure_ascii=False)
        deltas = [{"type": "input_json_delta", "partial_json": partial}]
    else:
        empty = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": block["text"]}] if block["text"] else []
    return [
        _event("content_block_start", index=index, content_block=empty),
        *(_event("content_block_delta", index=index, delta=delta) for delta in deltas),
        _event("content_block_stop", index=index),
    ]


# ---------------------------------------------------------------- errors and token counts


def error_body(status: int, message: str, kind: str) -> dict:
    """`{"type":"error","error":{type,message}}` with the type Anthropic uses for that kind or status.

    Context overflows say "prompt is too long": Claude Code keys its auto-compaction on that text.
    """
    error_type = _KIND_TYPES.get(kind) or _STATUS_TYPES.get(status, "api_error")
    if status == 400 and _CONTEXT_OVERFLOW.search(message) and "prompt is too long" not in message:
        message = f"prompt is too long: {message}"
    return {"type": "error", "error": {"type": error_type, "message": message}, "request_id": None}


def error_event(status: int, message: str, kind: str) -> bytes:
    """The in-stream form of `error_body`, for failures after the SSE response has begun."""
    return sse_frame(error_body(status, message, kind), event="error")


def count_tokens_body(n: int) -> dict:
    return {"input_tokens": n}
