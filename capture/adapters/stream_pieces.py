"""What a vLLM chat chunk adds to the answer, as typed pieces every provider stream translator reads.

A live stream and a complete answer go through the same translators: `whole_chunk(chat)` is the complete
answer as one chunk, so the synthetic stream is the live translation of a one-chunk stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracetap.capture.adapters.base import StreamTranslator, first_choice, reasoning_text

REASONING, TEXT, CALL, ARGUMENTS = "reasoning", "text", "call", "arguments"


@dataclass(frozen=True)
class Piece:
    """reasoning | text: `text` is new text; call: tool call `index` starts (`call_id`, `name`);
    arguments: more of call `index`'s arguments."""

    kind: str
    text: str = ""
    index: int = 0
    call_id: str | None = None
    name: str | None = None


def pieces(chunk: dict) -> list[Piece]:
    """The pieces of a chunk's first choice, in vLLM's order: reasoning, content, tool calls."""
    choice: dict = next((c for c in chunk.get("choices") or [] if c.get("index", 0) == 0), {})
    delta = choice.get("delta") or {}
    found = []
    if reasoning := reasoning_text(delta):
        found.append(Piece(REASONING, reasoning))
    if isinstance(text := delta.get("content"), str) and text:
        found.append(Piece(TEXT, text))
    for call in delta.get("tool_calls") or []:
        found += _call_pieces(call)
    return found


def _call_pieces(call: dict) -> list[Piece]:
    index, function = call.get("index", 0), call.get("function") or {}
    found = []
    if call.get("id") or function.get("name"):
        found.append(Piece(CALL, index=index, call_id=call.get("id"), name=function.get("name")))
    if function.get("arguments"):
        found.append(Piece(ARGUMENTS, function["arguments"], index))
    return found


def whole_chunk(chat: dict) -> dict:
    """A complete chat answer as the one chunk that streams it."""
    message = first_choice(chat).get("message") or {}
    delta: dict = {"role": "assistant", "content": message.get("content")}
    if reasoning := reasoning_text(message):
        delta["reasoning"] = reasoning
    calls = message.get("tool_calls") or []
    delta["tool_calls"] = [{**call, "index": index} for index, call in enumerate(calls)]
    return {"choices": [{"index": 0, "delta": delta}], "usage": chat.get("usage")}


def replayed(translator: StreamTranslator, chat: dict) -> list[bytes]:
    """The whole stream of a complete answer: the live translation of it as one chunk."""
    return translator.events(whole_chunk(chat)) + translator.closing(chat) + translator.terminal(chat)


@dataclass
class PendingCall:
    """A tool call being streamed: its arguments are gathered, then translated whole when it ends
    (providers want parsed arguments, and a call's final shape depends on all of them)."""

    index: int
    call_id: str | None
    name: str | None
    arguments: str = ""

    def as_chat(self) -> dict:
        return {"id": self.call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
