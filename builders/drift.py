"""Drift: where the copy of a turn in the next prompt differs from what the model sampled.

A merged trace trains on the sampled ids, but the model's next turn was conditioned on the copy the
harness sent back. Each difference is reported as a span of both sides, of one kind:
- `tokenization`: the same text in other ids (a re-rendered token boundary); harmless context drift;
- `content`: the text changed (a harness dropped thought parts, edited a message): the trace would
  train on text the model no longer saw, so trainability flags it;
- `template`: the empty think block a template adds after the generation prompt only
  (`enable_thinking=false`), missing from the copy; the turn's own text is unchanged;
- `unknown`: no decode function was given, so text could not be compared (flagged, conservatively).

Builders have no tokenizer: the caller hands in `decode(ids) -> str`, the same function the store's
SQL `decode()` uses. Comparing decoded spans is local and exact for the tokenizer that produced the
ids; a wrong tokenizer can only turn tokenization drift into content drift (the safe direction).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

import numpy as np
from tracetap.builders.tokens import common_prefix_len

Decode = Callable[[Sequence[int]], str]
TOKENIZATION, CONTENT, TEMPLATE, UNKNOWN = "tokenization", "content", "template", "unknown"
DIFF_LIMIT = 4096  # longer differing middles are reported as one span (the diff is quadratic)


@dataclass(frozen=True)
class DriftSpan:
    """One difference: [start, end) in the call's sampled ids (negative: the tokens just before them,
    in the call's prompt) and [start, end) in the next call's prompt."""

    completion_id: str  # the call whose turn drifted
    next_completion_id: str  # the call whose prompt holds the copy
    kind: str
    sampled: tuple[int, int]
    copy: tuple[int, int]

    @property
    def tokens(self) -> int:
        return max(self.sampled[1] - self.sampled[0], self.copy[1] - self.copy[0])

    def to_json(self) -> dict:
        return {"completion_id": self.completion_id, "next_completion_id": self.next_completion_id,
                "kind": self.kind, "sampled": list(self.sampled), "copy": list(self.copy), "tokens": self.tokens}


def _common_suffix_len(a: np.ndarray, b: np.ndarray, limit: int) -> int:
    return common_prefix_len(a[::-1][:limit], b[::-1][:limit])


def _differing(sampled: np.ndarray, copy: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(sampled start, end, copy start, end) of each differing region."""
    if np.array_equal(sampled, copy):  # the usual turn: copied verbatim, one pass instead of two
        return []
    head = common_prefix_len(sampled, copy)
    tail = _common_suffix_len(sampled[head:], copy[head:], min(len(sampled), len(copy)) - head)
    a, b = sampled[head:len(sampled) - tail], copy[head:len(copy) - tail]
    if not len(a) and not len(b):
        return []
    if max(len(a), len(b)) > DIFF_LIMIT:
        return [(head, head + len(a), head, head + len(b))]
    opcodes = SequenceMatcher(None, a.tolist(), b.tolist(), autojunk=False).get_opcodes()
    return [(head + i1, head + i2, head + j1, head + j2) for op, i1, i2, j1, j2 in opcodes if op != "equal"]


def _kind(sampled: np.ndarray, copy: np.ndarray, decode: Decode | None) -> str:
    """Ids added or removed on one side only are content (no text is zero tokens), else compare text."""
    if not len(sampled) or not len(copy):
        return CONTENT
    if decode is None:
        return UNKNOWN
    return TOKENIZATION if decode(sampled.tolist()) == decode(copy.tolist()) else CONTENT


def turn_drift(sampled: np.ndarray, copy: np.ndarray, copy_at: int, ids: tuple[str, str],
               decode: Decode | None) -> list[DriftSpan]:
    """Spans where `copy` (found at `copy_at` in the next prompt) differs from `sampled`.

    `ids`: (completion id of the turn, completion id of the next call).
    """
    return [DriftSpan(*ids, _kind(sampled[s0:s1], copy[c0:c1], decode), (s0, s1), (copy_at + c0, copy_at + c1))
            for s0, s1, c0, c1 in _differing(sampled, copy)]


def template_drift(block: int, copy_at: int, ids: tuple[str, str]) -> DriftSpan:
    """The generation prompt's empty think block (`block` tokens right before the sampled ids, hence
    the negative sampled start), absent where the copy starts at `copy_at` in the next prompt."""
    return DriftSpan(*ids, TEMPLATE, (-block, 0), (copy_at, copy_at))
