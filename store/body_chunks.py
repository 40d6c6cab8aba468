"""Cutting a JSON request body into chunks on exact character spans (store/compact_form.py stores them).

Every item of a top-level array (messages, tools, contents, input) and every long top-level value (a
system prompt) is a chunk; the template is the text around them, each replaced by PLACEHOLDER. An agent
resends its whole conversation with each call, so a body mostly repeats the session's previous one: the
chunks inside the prefix the two share are taken as they were, and the parse resumes after the last of
them (inside its array), so a call costs what it adds, not its whole conversation.
"""

from __future__ import annotations

import json
import re
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

MIN_CHUNK = 32  # characters: shorter JSON values stay in the template
COMPARE_BLOCK = 4096  # characters compared at once when finding what a body repeats of the previous one
PLACEHOLDER = "\x01"  # never in valid JSON text (raw control characters are not allowed)

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _skip(text: str, at: int) -> int:
    """The index of the first non-blank character at or after `at`."""
    blank = _WHITESPACE.match(text, at)
    return blank.end() if blank else at


@dataclass
class Chunks:
    """Where a body's chunks are: their character spans, whether each is an array item (else a member's
    whole value), and, once hashed, their keys (8 bytes each, concatenated)."""

    starts: array = field(default_factory=lambda: array("q"))
    ends: array = field(default_factory=lambda: array("q"))
    items: bytearray = field(default_factory=bytearray)
    keys: bytes = b""

    def add(self, start: int, end: int, item: bool) -> None:
        if end - start >= MIN_CHUNK:
            self.starts.append(start)
            self.ends.append(end)
            self.items.append(item)

    def head(self, count: int) -> Chunks:
        """The first `count` chunks (a copy)."""
        return Chunks(self.starts[:count], self.ends[:count], self.items[:count], self.keys[:8 * count])


@dataclass(eq=False)
class Body:
    """A body a session sent lately, and its chunks: the next call of its thread resends most of it."""

    text: str
    chunks: Chunks
    template: str  # the text around the chunks, each replaced by PLACEHOLDER


def _placeholder_at(chunks: Chunks, index: int) -> int:
    """Where the template has the placeholder of chunk `index`: its start less the chunks before it, each
    one character there."""
    starts, ends = np.frombuffer(chunks.starts, dtype=np.int64), np.frombuffer(chunks.ends, dtype=np.int64)
    return int(starts[index] - (ends[:index] - starts[:index]).sum() + index)


def template(text: str, chunks: Chunks, previous: Body | None, reused: int) -> str:
    """The text around the chunks, each chunk replaced by PLACEHOLDER; up to the last of the `reused`
    chunks (the first ones, taken from `previous`; None when none is) it is the previous body's template."""
    head = "" if previous is None else previous.template[:_placeholder_at(previous.chunks, reused - 1) + 1]
    gaps = zip([0, *chunks.ends][reused:], [*chunks.starts, len(text)][reused:], strict=True)
    return head + PLACEHOLDER.join(text[start:end] for start, end in gaps)


def _common_prefix(a: str, b: str) -> int:
    """Length of the common prefix of two texts: compared block by block, then by halving the first block
    that differs (slices compare at memory speed; a character loop would cost more than the parse saved)."""
    n = min(len(a), len(b))
    low = high = 0
    while low < n:
        high = min(low + COMPARE_BLOCK, n)
        if a[low:high] != b[low:high]:
            break
        low = high
    else:
        return n
    while high - low > 1:
        middle = (low + high) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle
    return low


def _repeated_count(previous: Body, text: str) -> int:
    """How many of the previous body's chunks this text repeats at the same places, up to the last that ends
    a string, object or array (a number could go on in the new text)."""
    shared = _common_prefix(previous.text, text)
    count = bisect_right(previous.chunks.ends, shared)
    while count and previous.text[previous.chunks.ends[count - 1] - 1] not in '"]}':
        count -= 1
    return count


def repeated_chunks(recent: list[Body], text: str) -> tuple[Body | None, Chunks | None]:
    """The recent body this text repeats the most chunks of (a conversation resent with more turns; the
    session's other threads, sub-agents and side calls, sent theirs in between), and those chunks."""
    counts = [_repeated_count(body, text) for body in recent]
    if not any(counts):
        return None, None
    best = max(range(len(recent)), key=counts.__getitem__)
    return recent[best], recent[best].chunks.head(counts[best])


def _items(text: str, at: int, chunks: Chunks) -> int:
    """An array's items from `at` (its first item, or its `]`); returns the index past its `]`."""
    while text[at] != "]":
        end = _DECODER.raw_decode(text, at)[1]
        chunks.add(at, end, True)
        at = _after(text, end, "]")
    return at + 1


def _after(text: str, end: int, close: str) -> int:
    """From the end of an item or member: past its comma, or at the `close` that ends the container."""
    at = _skip(text, end)
    if text[at] == ",":
        return _skip(text, at + 1)
    if text[at] != close:
        raise ValueError(f"expected , or {close}")
    return at


def _members(text: str, at: int, chunks: Chunks) -> int:
    """The top-level object's members from `at` (a member's name, or its `}`); returns the index past it.
    Every item of a member's array, or a member's long value, is a chunk."""
    while text[at] != "}":
        at = _skip(text, _DECODER.raw_decode(text, at)[1])  # the member's name
        if text[at] != ":":
            raise ValueError("expected :")
        at = _skip(text, at + 1)
        if text[at] == "[":
            end = _items(text, _skip(text, at + 1), chunks)
        else:
            end = _DECODER.raw_decode(text, at)[1]
            chunks.add(at, end, False)
        at = _after(text, end, "}")
    return at + 1


def chunk_spans(text: str, known: Chunks | None = None) -> Chunks | None:
    """The chunks of a JSON object body; None when it is no JSON object. `known`: chunks this text is
    known to start with (up to the end of the last), so only the rest is parsed."""
    try:
        if known is not None and known.ends:
            chunks, end = known, known.ends[-1]
            if known.items[-1]:  # the rest of that array first
                end = _items(text, _after(text, end, "]"), chunks)
            at = _members(text, _after(text, end, "}"), chunks)
        else:
            chunks, at = Chunks(), _skip(text, 0)
            if text[at] != "{":
                return None
            at = _members(text, _skip(text, at + 1), chunks)
        return chunks if _skip(text, at) == len(text) else None
    except (ValueError, IndexError):
        return None
