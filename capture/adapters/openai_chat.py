"""OpenAI Chat Completions <-> the upstream's Chat Completions: a checked, normalized pass-through.

Requests: shapes are checked against `schemas.openai_chat` (a 400 naming the field instead of an
upstream pydantic dump), `developer` becomes `system`, `max_completion_tokens` becomes `max_tokens`,
only the fields the upstream API defines are forwarded (chat_fields.py: never an `api_key` or SDK
`extra_headers`), and the model becomes the served one. Responses: the upstream body with the
harness's own model name and without token arrays; streams are replayed as chunks (protocols.md §4.1).
"""

from __future__ import annotations

import time

from tracetap.capture.adapters.base import (
    AdapterError,
    RequestContext,
    first_choice,
    reasoning_text,
    request_body,
    sse_frame,
)
from tracetap.capture.adapters.chat_fields import forwarded
from tracetap.capture.adapters.schemas import validate
from tracetap.capture.adapters.schemas.openai_chat import ChatRequest
from tracetap.capture.adapters.stream_pieces import CALL, REASONING, TEXT, Piece, pieces, replayed

API = "openai_chat"
_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "not_found": "invalid_request_error",
    "unauthorized": "authentication_error",
    "forbidden": "permission_error",
    "payload_too_large": "invalid_request_error",
    "timeout": "timeout_error",
    "upstream_unreachable": "api_error",
    "upstream_error": "api_error",
    "internal": "server_error",
}
_UPSTREAM_ONLY = ("prompt_token_ids", "prompt_logprobs", "prompt_text")
_CREATED = int(time.time())  # models have no creation date here; the gateway's start stands in


def to_chat_request(body: dict, ctx: RequestContext) -> dict:
    """The harness's request as the upstream should see it. Raises AdapterError on bad input."""
    validate(ChatRequest, body)
    if body.get("n") not in (None, 1):
        raise AdapterError("n other than 1 is not supported: the gateway records one completion per call")
    chat = forwarded(body)  # shared values are never mutated
    chat["messages"] = [_normalize_message(m) for m in chat["messages"]]
    if "max_tokens" not in chat and "max_completion_tokens" in body:
        chat["max_tokens"] = body["max_completion_tokens"]
    chat["model"] = ctx.served_model or ctx.requested_model
    return chat


def _normalize_message(message: dict) -> dict:
    if message["role"] == "developer":
        return {**message, "role": "system"}
    return message


def from_chat_response(chat: dict, ctx: RequestContext) -> dict:
    """The upstream body as the harness expects it: its model name, our id, no token arrays."""
    out = {k: v for k, v in chat.items() if k not in _UPSTREAM_ONLY}  # shared values are never mutated
    out.update(id=ctx.completion_id, model=ctx.requested_model)
    keep_logprobs = _asked_logprobs(ctx)
    out["choices"] = [_client_choice(c, keep_logprobs) for c in chat.get("choices") or []]
    return out


def _client_choice(choice: dict, keep_logprobs: bool) -> dict:
    out = {k: v for k, v in choice.items() if k != "token_ids"}
    if not keep_logprobs:
        out["logprobs"] = None
    message = dict(out.get("message") or {})
    reasoning = reasoning_text(message)
    if reasoning:
        message["reasoning_content"] = message["reasoning"] = reasoning
    out["message"] = message
    return out


def _asked_logprobs(ctx: RequestContext) -> bool:
    return request_body(ctx).get("logprobs") is True


def to_sse_events(chat: dict, ctx: RequestContext) -> list[bytes]:
    """The complete answer replayed as a chunk stream an OpenAI client folds back into it."""
    return replayed(translator(ctx), chat)


def translator(ctx: RequestContext) -> ChunkStream:
    return ChunkStream(ctx)


class ChunkStream:
    """vLLM's chunks under the harness's id and model, one kind of delta per chunk, without token arrays.

    Logprobs (when asked) come whole on the finish chunk, which is held with `[DONE]` as the terminal part.
    """

    def __init__(self, ctx: RequestContext):
        self.ctx = ctx
        self.base = {"id": ctx.completion_id, "object": "chat.completion.chunk", "created": ctx.created,
                     "model": ctx.requested_model}
        self.started = False

    def events(self, chunk: dict) -> list[bytes]:
        opening = [] if self.started else [_chunk(self.base, {"role": "assistant", "content": ""})]
        self.started = True
        return opening + [_chunk(self.base, _delta(piece)) for piece in pieces(chunk)]

    def closing(self, chat: dict) -> list[bytes]:
        return [] if self.started else self.events({})

    def terminal(self, chat: dict) -> list[bytes]:
        choice = first_choice(chat)
        logprobs = choice.get("logprobs") if _asked_logprobs(self.ctx) else None
        frames = [_chunk(self.base, {}, choice.get("finish_reason") or "stop", logprobs)]
        if (request_body(self.ctx).get("stream_options") or {}).get("include_usage"):
            frames.append(sse_frame({**self.base, "choices": [], "usage": chat.get("usage")}))
        return frames + [sse_frame("[DONE]")]

    def error(self, status: int, message: str, kind: str) -> list[bytes]:
        """An error chunk, as vLLM sends one mid-stream: the OpenAI SDK raises it."""
        return [sse_frame(error_body(status, message, kind))]


def _delta(piece: Piece) -> dict:
    if piece.kind == REASONING:
        return {"reasoning": piece.text, "reasoning_content": piece.text}
    if piece.kind == TEXT:
        return {"content": piece.text}
    if piece.kind == CALL:
        function = {"name": piece.name, "arguments": ""}
        return {"tool_calls": [{"index": piece.index, "id": piece.call_id, "type": "function", "function": function}]}
    return {"tool_calls": [{"index": piece.index, "function": {"arguments": piece.text}}]}


def _chunk(base: dict, delta: dict, finish_reason: str | None = None, logprobs: dict | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    return sse_frame({**base, "choices": [choice]})


def model_body(name: str) -> dict:
    """One model entry that both the OpenAI and the Anthropic SDK parse (protocols.md §1.2)."""
    return {"id": name, "object": "model", "type": "model", "created": _CREATED,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_CREATED)),
            "owned_by": "tracetap", "display_name": name}


def models_body(names: list[str]) -> dict:
    """`GET /v1/models`, shared by OpenAI clients, the Anthropic SDK and Codex: one union body."""
    first, last = (names[0], names[-1]) if names else (None, None)
    return {"object": "list", "data": [model_body(n) for n in names], "has_more": False,
            "first_id": first, "last_id": last, "models": []}


def error_body(status: int, message: str, kind: str = "invalid_request") -> dict:
    """OpenAI's error envelope; the SDK picks its exception class from the HTTP status."""
    return {"error": {"message": message, "type": _ERROR_TYPES.get(kind, "api_error"), "param": None,
                      "code": kind}}
