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
from tracetap.capture.adapters.stream_pieces import ARGUMENTS, CALL, REASONING, PendingCall, Piece, pieces, replayed

__all__ = ["API", "count_tokens_body", "error_body", "error_event", "from_chat_response", "to_chat_request",
           "to_sse_events", "translator"]

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
_EMPTY_BLOCKS = {"thinking": {"type": "thinking", "thinking": "", "signature": ""},
                 "text": {"type": "text", "text": ""}}
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
    return replayed(translator(ctx), chat)


def translator(ctx: RequestContext) -> MessageStream:
    return MessageStream(ctx)


class MessageStream:
    """Blocks open and close as the kind of piece changes. A thinking block ends with the signature of
    its whole text; a tool_use block sends its input as one JSON delta when it ends (the input must be
    a JSON object, so the arguments are parsed whole). `message_delta` + `message_stop` are terminal."""

    def __init__(self, ctx: RequestContext):
        self.ctx = ctx
        self.started = False
        self.index = -1  # of the open block (or the last one)
        self.open: dict | None = None  # the open block: its type and what it gathered
        self.call: PendingCall | None = None

    def events(self, chunk: dict) -> list[bytes]:
        events = [] if self.started else [self._message_start(chunk)]
        self.started = True
        for piece in pieces(chunk):
            events += self._piece(piece)
        return events

    def closing(self, chat: dict) -> list[bytes]:
        events = [] if self.started else self.events({"usage": chat.get("usage")})
        if self.index < 0:  # an empty answer is one empty text block
            events += self._open("text", dict(_EMPTY_BLOCKS["text"]))
        return events + self._close()

    def terminal(self, chat: dict) -> list[bytes]:
        message = from_chat_response(chat, self.ctx)
        delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
        return [_event("message_delta", delta=delta, usage=message["usage"]), _event("message_stop")]

    def error(self, status: int, message: str, kind: str) -> list[bytes]:
        return [error_event(status, message, kind)]

    def _message_start(self, chunk: dict) -> bytes:
        """The opening message; its input tokens from the chunk's usage, else from its prompt ids."""
        prompt = {"prompt_tokens": len(chunk.get("prompt_token_ids") or [])}
        empty = {"choices": [{"message": {"content": None}}], "usage": chunk.get("usage") or prompt}
        message = from_chat_response(empty, self.ctx)
        opening = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {**message["usage"], "output_tokens": 0}}
        return _event("message_start", message=opening)

    def _piece(self, piece: Piece) -> list[bytes]:
        if piece.kind == ARGUMENTS:
            if self.call is not None and self.call.index == piece.index:
                self.call.arguments += piece.text
            return []
        if piece.kind == CALL:
            return self._tool_use(piece)
        kind = "thinking" if piece.kind == REASONING else "text"
        events = [] if self.open and self.open["type"] == kind else self._switch(kind)
        assert self.open is not None  # just opened, or already open
        self.open[kind] += piece.text
        return events + [_event("content_block_delta", index=self.index,
                                delta={"type": f"{kind}_delta", kind: piece.text})]

    def _switch(self, kind: str) -> list[bytes]:
        return self._close() + self._open(kind, dict(_EMPTY_BLOCKS[kind]))

    def _tool_use(self, piece: Piece) -> list[bytes]:
        events = self._close()
        self.call = PendingCall(piece.index, piece.call_id, piece.name)
        block = {"type": "tool_use", "id": _tool_use_id(piece.call_id, self.ctx.completion_id, piece.index),
                 "name": piece.name or "", "input": {}}
        return events + self._open("tool_use", block)

    def _open(self, kind: str, block: dict) -> list[bytes]:
        self.index += 1
        self.open = {"type": kind, "thinking": "", "text": ""}
        return [_event("content_block_start", index=self.index, content_block=block)]

    def _close(self) -> list[bytes]:
        """End the open block: a thinking block's signature or a tool call's input first."""
        if self.open is None:
            return []
        events = [_event("content_block_delta", index=self.index, delta=delta) for delta in self._last_deltas()]
        self.open, self.call = None, None
        return events + [_event("content_block_stop", index=self.index)]

    def _last_deltas(self) -> list[dict]:
        assert self.open is not None  # only called with a block open
        if self.open["type"] == "thinking":
            return [{"type": "signature_delta", "signature": synthetic_signature(self.open["thinking"])}]
        if self.open["type"] == "tool_use" and self.call is not None:
            partial = json.dumps(arguments_object(self.call.arguments), ensure_ascii=False)
            return [{"type": "input_json_delta", "partial_json": partial}]
        return []


def _event(kind: str, **fields: object) -> bytes:
    return sse_frame({"type": kind, **fields}, event=kind)


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
