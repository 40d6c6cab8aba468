"""The contract every provider adapter follows.

An adapter is a module of pure functions (no I/O) that translate between one provider API and
OpenAI Chat Completions, the only shape the upstream engine speaks:

    to_chat_request(body, ctx)        provider request   -> chat request (dict)
    from_chat_response(chat, ctx)     chat response      -> provider response (dict)
    to_sse_events(chat, ctx)          chat response      -> provider SSE stream (list of bytes frames)
    error_body(status, message, kind) error              -> provider error body (dict)

plus `count_tokens_body(n)` for APIs with a token-count endpoint (`TokenCounter`) and
`model_body(name)` / `models_body(names)` for APIs with their own model list (`ModelLister`). `chat` is
always a complete, non-streaming vLLM-style response (`choices[0].message.{content,
reasoning|reasoning_content, tool_calls}`, `finish_reason`, `stop_reason`, `usage`).

Streams come from one `StreamTranslator` per call (`translator(ctx)`): fed vLLM chunks as they arrive,
it gives the provider's events as they become known; `closing` and `terminal` end the stream from the
folded answer. `to_sse_events` is that translator fed the complete answer as one chunk
(`stream_pieces.whole_chunk`), so a synthetic stream and a live one are the same translation.
The contract is the `Adapter` Protocol below, which mypy checks every adapter module against
(capture/adapters/__init__.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tracetap.capture.jsontext import dumps, escape_surrogates


class AdapterError(ValueError):
    """Bad input from the harness: becomes a 4xx in the caller's API shape."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request"):
        super().__init__(message)
        self.status = status
        self.kind = kind


# Shared error kinds, mapped by each adapter to its own type names.
ERROR_KINDS = (
    "invalid_request",       # 400
    "not_found",             # 404
    "payload_too_large",     # 413
    "timeout",               # 504
    "upstream_unreachable",  # 502
    "upstream_error",        # any upstream HTTP error status
    "conflict",              # 409
    "unavailable",           # 503 (paused for a weight update)
    "internal",              # 500
)


@dataclass(frozen=True)
class RequestContext:
    """What an adapter needs to know beyond the body."""

    requested_model: str
    served_model: str
    stream: bool = False
    completion_id: str = "cmpl-0"
    created: int = 0
    path: str = ""
    extra: dict = field(default_factory=dict)  # the gateway passes the harness's body as "request"


class StreamTranslator(Protocol):
    """One call's provider stream, built from vLLM chat chunks (pure: bytes in, bytes out)."""

    def events(self, chunk: dict, /) -> list[bytes]:
        """The events a chunk makes known (the stream's opening events come with the first)."""
        ...

    def closing(self, chat: dict, /) -> list[bytes]:
        """What ends the open blocks, given the folded answer; sent before the answer is durable."""
        ...

    def terminal(self, chat: dict, /) -> list[bytes]:
        """The events that tell a client the answer is complete: held until it is recorded."""
        ...

    def error(self, status: int, message: str, kind: str, /) -> list[bytes]:
        """A failure after the stream began, in the API's in-stream error shape (instead of `terminal`)."""
        ...


class Adapter(Protocol):
    """One provider API (a module of pure functions; parameters are positional)."""

    def to_chat_request(self, body: dict, ctx: RequestContext, /) -> dict: ...

    def from_chat_response(self, chat: dict, ctx: RequestContext, /) -> dict: ...

    def to_sse_events(self, chat: dict, ctx: RequestContext, /) -> list[bytes]: ...

    def translator(self, ctx: RequestContext, /) -> StreamTranslator: ...

    def error_body(self, status: int, message: str, kind: str, /) -> dict: ...


class TokenCounter(Protocol):
    """An API with a token-count endpoint: the answer for a prompt of `n` tokens."""

    def count_tokens_body(self, n: int, /) -> dict: ...


class ModelLister(Protocol):
    """An API with its own model-list shapes."""

    def model_body(self, name: str, /) -> dict: ...

    def models_body(self, names: list[str], /) -> dict: ...


def request_body(ctx: RequestContext) -> dict:
    """The harness's original request body (`ctx.extra["request"]`), or {} when the caller passed none:
    some answers echo or honour fields of the request (logprobs, include_usage, tools, thoughts)."""
    body = ctx.extra.get("request")
    return body if isinstance(body, dict) else {}


def sse_frame(data: dict | str, event: str | None = None) -> bytes:
    """One SSE frame: optional `event:` line, one single-line `data:` line, blank line."""
    payload = data if isinstance(data, str) else dumps(data)
    head = f"event: {event}\n" if event else ""
    return escape_surrogates(f"{head}data: {payload}\n\n").encode()


def first_choice(chat: dict) -> dict:
    choices = chat.get("choices") or [{}]
    return choices[0]


def reasoning_text(message: dict) -> str | None:
    """vLLM 0.32 says `reasoning`; older servers and SGLang say `reasoning_content`."""
    return message.get("reasoning") or message.get("reasoning_content") or None
