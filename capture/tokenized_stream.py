"""`--tokenize gateway` streaming: the upstream's `/v1/completions` chunks as vLLM chat chunks, as they arrive.

Each completions chunk's sampled ids go through the incremental parser (tokens/streaming.py); the chat chunk
carries those ids, their chat-shaped logprobs and the delta they made certain. The first carries the prompt
ids and the role, the finishing one the rest of the reply (tool calls whole) and the finish reason the
non-streamed parse gives, so the folded stream is the body `TokenizingUpstream.chat` returns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tracetap.capture.upstream import SSEStream, UpstreamError
from tracetap.tokens.streaming import ReplyStream

Entries = Callable[[list[int], dict | None], dict | None]  # legacy logprobs of some ids -> chat-shaped


def chat_id(completion_id: object) -> str:
    """The chat completion id for an upstream `cmpl-...` id."""
    return f"chatcmpl-{str(completion_id or '').removeprefix('cmpl-')}"


class ChatChunks:
    """The upstream's completions stream read as a chat chunk stream (what LiveChatStream folds).

    `done` gets the sampled ids once the upstream ended the stream (`[DONE]`), never for one stopped early."""

    def __init__(self, events: SSEStream, parser: ReplyStream, entries: Entries,
                 done: Callable[[list[int]], Awaitable[None]], metadata: dict) -> None:
        self.events, self.parser, self.entries, self.done, self.metadata = events, parser, entries, done, metadata

    @property
    def engine(self) -> str:
        return self.events.engine

    @property
    def finished(self) -> bool:
        return self.events.finished

    def __aiter__(self) -> ChatChunks:
        return self

    async def __anext__(self) -> dict:
        try:
            upstream = await self.events.__anext__()
        except StopAsyncIteration:
            await self.done(self.parser.ids)
            raise
        except UpstreamError as exc:
            exc.metadata = self.metadata
            raise
        return self._translated(upstream)

    async def aclose(self) -> None:
        await self.events.aclose()

    def _translated(self, upstream: dict) -> dict[str, Any]:
        """The chat chunk; a completions chunk without the fields it needs is an `invalid` UpstreamError."""
        try:
            return self._chunk(upstream)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            error = UpstreamError("invalid", f"the upstream's completion chunk is unusable: {exc}", 502, upstream)
            error.metadata = self.metadata
            raise error from None

    def _chunk(self, upstream: dict) -> dict[str, Any]:
        """One chat chunk per completions chunk (the usage chunk keeps its empty choices)."""
        chunk = {"id": chat_id(upstream.get("id")), "object": "chat.completion.chunk",
                 "created": upstream.get("created"), "model": upstream.get("model"),
                 "choices": [self._choice(part) for part in upstream["choices"][:1]]}
        for key in ("usage", "system_fingerprint"):
            if upstream.get(key) is not None:
                chunk[key] = upstream[key]
        first = (upstream["choices"] or [{}])[0].get("prompt_token_ids")
        return chunk | ({"prompt_token_ids": first} if first is not None else {})

    def _choice(self, part: dict) -> dict[str, Any]:
        ids = [int(i) for i in part.get("token_ids") or []]
        delta, finish = self.parser.feed(ids), part.get("finish_reason")
        if finish is not None:
            rest, finish = self.parser.finish(finish, part.get("stop_reason"))
            delta = joined(delta, rest)
        if part.get("prompt_token_ids") is not None:
            delta = {"role": "assistant", **delta}
        choice = {"index": 0, "delta": delta, "logprobs": self.entries(ids, part.get("logprobs")),
                  "finish_reason": finish, "token_ids": ids}
        return choice | ({"stop_reason": part.get("stop_reason")} if finish is not None else {})


def joined(first: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
    """Two deltas as one: text fields end to end, the rest from `then`."""
    both = {**first, **then}
    for key in first.keys() & then.keys():
        both[key] = first[key] + then[key]
    return both
