"""One session's prompts in the compact form (store/compact_form.py), any slice materialized on demand.

A call's prompt is the first `prompt_ref_len` tokens of the *sequence* (prompt + sampled ids) of the
call `prompt_ref_seq`, then its own suffix; a prompt stored whole is a suffix without a reference.
Materializing `prompt[start:]` walks the references back and copies each token it needs once, so
it costs the length of the slice, not of every prompt on the way: the builders take a turn's new
tail from here without ever holding the whole prompt, and the Python reader expands rows with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

EMPTY = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True)
class Stored:
    """One call's stored prompt: `ref` (seq or None), `length` tokens of its sequence, then `suffix`."""

    ref: int | None
    length: int
    suffix: np.ndarray
    sampled: np.ndarray  # the call's sampled ids (empty when none): the rest of its sequence


class Prompts:
    """The prompts of one session's calls, by seq, from their stored (compact) form."""

    def __init__(self, rows: Iterable[tuple[int, Stored]]) -> None:
        self._rows: dict[int, Stored] = {}
        self._lengths: dict[int, int] = {}
        for seq, stored in rows:
            self.add(seq, stored)

    def add(self, seq: int, stored: Stored) -> None:
        """Learn one call's prompt; a reference must name a call added before it."""
        if stored.ref is not None and stored.ref not in self._rows:
            raise ValueError(f"completion seq {seq} refers to seq {stored.ref}, which has no prompt")
        self._rows[seq] = stored
        self._lengths[seq] = stored.length + len(stored.suffix)

    def __contains__(self, seq: int) -> bool:
        return seq in self._rows

    def stored(self, seq: int) -> Stored:
        return self._rows[seq]

    def length(self, seq: int) -> int:
        """The prompt's length in tokens (nothing is materialized)."""
        return self._lengths[seq]

    def prompt(self, seq: int, start: int = 0) -> np.ndarray:
        """`prompt[start:]` of the call `seq`, as one int32 array (no copy when one stored piece holds it)."""
        pieces, end, at = [], self._lengths[seq], seq
        while end > start:
            row = self._rows[at]
            if end > row.length:
                pieces.append(row.suffix[max(start, row.length) - row.length:end - row.length])
                end = row.length
            if end <= start or row.ref is None:
                break
            at, ref_length = row.ref, self._lengths[row.ref]
            if end > ref_length:
                pieces.append(self._rows[at].sampled[max(start, ref_length) - ref_length:end - ref_length])
                end = ref_length
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces[::-1]).astype(np.int32, copy=False) if pieces else EMPTY
