"""Sampled ids in, chat deltas out, as they arrive: the streaming face of tokens/message.py.

Every delta is text the finished reply surely starts with, so the deltas fold into exactly the message
`chat_message` gives for the same ids. Held back until the next ids decide it: an incomplete UTF-8
character, a suffix that may begin a stop string or a `</think>`, a reply that may still open `<think>`,
whitespace the tool-call parse may strip, and everything from the first `<tool_call>` on: a later
malformed block turns every call back into text (vLLM's rule), so calls and the text around them come
whole when the reply ends.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from tracetap.tokens.message import Decoder, ToolUse, chat_message
from tracetap.tokens.parsing import THINK_END, THINK_START, reasoning_start

TOOL_CALL_START = "<tool_call>"
PARTIAL_CHARACTER = "\ufffd"  # what decoding shows for the first bytes of a character


@dataclass(frozen=True)
class Settings:
    """How the request asked the reply to be read (the same arguments `chat_message` takes)."""

    tools: ToolUse = ToolUse()
    opened: bool = False  # the prompt left a `<think>` open
    stops: Sequence[str] = ()
    stop_token_ids: Collection[int] = ()
    include_stop: bool = False


class ReplyStream:
    """Feed sampled ids chunk by chunk, get chat deltas; `finish` flushes and gives the finish reason."""

    def __init__(self, decoder: Decoder, settings: Settings = Settings()) -> None:
        self.decoder, self.settings = decoder, settings
        self.ids: list[int] = []
        self._text = Decoded(decoder)
        self._pending: list[int] = []  # a stop token id, maybe cut from the visible text at the end
        self._sent: dict[str, str | None] = {"reasoning": None, "content": None}

    def feed(self, ids: list[int]) -> dict[str, Any]:
        """The delta these ids make certain (`{}` when they only extend what is held back)."""
        self.ids += ids
        ready = self._pending + ids
        cut = bool(ready) and ready[-1] in self.settings.stop_token_ids
        self._pending = ready[-1:] if cut else []
        text = held_stop(self._text.add(ready[:-1] if cut else ready), self.settings.stops)
        reasoning, content = certain(text, self.settings)
        return self._advance({"reasoning": reasoning, "content": content})

    def finish(self, finish_reason: str, stop_reason: str | int | None) -> tuple[dict[str, Any], str]:
        """The rest of the reply (tool calls whole) and the finish reason, as `chat_message` parses it."""
        s = self.settings
        message, finish = chat_message(self.ids, finish_reason, stop_reason, self.decoder, s.tools,
                                       s.include_stop, s.opened)
        delta = self._advance({key: message[key] for key in self._sent}, final=True)
        if message["tool_calls"]:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        return delta, finish

    def _advance(self, sure: dict[str, str | None], final: bool = False) -> dict[str, Any]:
        """What each field adds to what was sent; at the end an empty field is sent too (it folds to "")."""
        delta = {}
        for key, text in sure.items():
            sent = self._sent[key]
            if text is not None and (len(text) > len(sent or "") or (final and sent is None)):
                delta[key], self._sent[key] = text[len(sent or ""):], text
        return delta


class Decoded:
    """The visible text of the ids so far; only the ids after the last whole character are decoded again."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder, self.settled = decoder, ""
        self.tail: list[int] = []  # ids since the last whole character

    def add(self, ids: list[int]) -> str:
        """The text so far without a trailing incomplete character."""
        self.tail += ids
        text = self.decoder.decode(self.tail, skip_special_tokens=True)
        if text.endswith(PARTIAL_CHARACTER):
            return self.settled + text.rstrip(PARTIAL_CHARACTER)
        self.settled, self.tail = self.settled + text, []
        return self.settled


def certain(text: str, settings: Settings) -> tuple[str, str]:
    """The reasoning and content a reply beginning with `text` surely begins with."""
    if not settings.opened and THINK_START.startswith(text.lstrip()):
        return "", ""  # may still open a <think>
    start = reasoning_start(text, settings.opened)
    if start is None:
        return "", certain_content(text, settings.tools.parse)
    head, closed, rest = text[start:].partition(THINK_END)
    if not closed:
        return without_partial(head, THINK_END).strip("\n"), ""
    return head.strip("\n"), certain_content(rest.lstrip("\n"), settings.tools.parse)


def certain_content(text: str, parse_tools: bool) -> str:
    """Content is sure up to the first `<tool_call>`; its edge whitespace only once it is not at an edge."""
    if not parse_tools:
        return text
    before, opened, _ = text.partition(TOOL_CALL_START)
    sure = before if opened else without_partial(before, TOOL_CALL_START)
    return "" if sure[:1].isspace() else sure.rstrip()


def held_stop(text: str, stops: Sequence[str]) -> str:
    """`text` up to where a stop string starts or may start (visible_text cuts there)."""
    cut = min((text.find(stop) for stop in stops if stop in text), default=len(text))
    for stop in stops:
        cut = min(cut, len(without_partial(text, stop)))
    return text[:cut]


def without_partial(text: str, tag: str) -> str:
    """`text` without its longest ending that is the start of `tag` (but not all of it)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return text[:-size]
    return text
