"""Route a session's calls into chains and segments by token prefixes (the core of prefix_merging).

Calls arrive in seq order. Every segment of every chain stays open, its *tip* being the prompt of
its latest turn. A call goes to:
1. the segment whose tip is the longest prefix of its prompt (ties: the most recently extended):
   - prompt == tip: another attempt at the tip turn (a retry, or a parallel sample);
   - prompt extends the tip: a new turn; the interstitial is the prompt's tail after the first
     end-of-turn token past the tip (that token included when the previous turn did not sample it,
     i.e. it was cut at `length`); no end-of-turn id known, or none in the tail: a break;
   - the tip's turn is an empty truncation (finish `length`, nothing visible to the harness) and
     the prompt extends the tip without its generation prompt: the harness dropped that turn; it
     is left out of the stream and the prompt's tail becomes interstitial;
2. else, when its prompt shares the whole first message of some tip (same system prompt: the same
   agent) and that tip is never extended later (the old history was abandoned, not paused): a new
   segment of that chain with break `canonical_prefix_break` (history rewritten, compaction);
3. else a new chain (a sub-agent, a parallel conversation, a fork from an earlier point).
When a turn with several attempts is extended, the attempt sharing the most tokens with its copy in
the new prompt is kept (the latest on a tie: a plain retry keeps the last attempt); the others open
chains of their own: a parallel branch when something extends them later, else a retry that is
recorded and left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from tracetap.builders.base import Call
from tracetap.builders.tokens import (
    common_prefix_len,
    drift,
    find_first,
    is_prefix,
    shared_tokens,
    strip_generation_prompt,
)

EMPTY = np.zeros(0, dtype=np.int32)


@dataclass
class Turn:
    """Interstitial context (`before`, mask 0) and the sampled ids of one kept attempt (mask 1)."""

    before: np.ndarray
    attempts: list[Call]
    retried: list[str] = field(default_factory=list)

    @property
    def call(self) -> Call:
        return self.attempts[-1]

    @property
    def prompt(self) -> np.ndarray:
        return self.attempts[0].prompt


@dataclass
class Segment:
    """A run of turns whose prompts strictly extend each other; a break starts the next one."""

    chain: int
    index: int
    break_reason: str | None
    prompt: np.ndarray
    turns: list[Turn]
    last_seq: int
    drift: int = 0
    empty_truncations: list[str] = field(default_factory=list)
    split_from: Turn | None = None  # opened by an attempt another attempt won against

    @property
    def tip(self) -> np.ndarray:
        return self.turns[-1].prompt


def _ends_turn(call: Call, eot: int) -> bool:
    return len(call.sampled) > 0 and call.sampled[-1] == eot


def _interstitial(call: Call, tail: np.ndarray, eot_at: int, eot: int) -> tuple[np.ndarray, np.ndarray]:
    """(canonical copy of `call`'s turn, interstitial) in the next prompt's tail."""
    cut = eot_at + 1 if _ends_turn(call, eot) else eot_at
    return tail[:cut], tail[cut:]


def _likeness(call: Call, tail: np.ndarray, eot_at: int, eot: int) -> int:
    """How much of the turn's copy in the next prompt `call` sampled (end-of-turn left out)."""
    return shared_tokens(call.sampled[:-1] if _ends_turn(call, eot) else call.sampled, tail[:eot_at])


class Router:
    """One pass over a session's calls; the result is `segments` (retries already left out)."""

    def __init__(self, calls: list[Call], eot: int | None) -> None:
        self.calls, self.eot = calls, eot
        self.segments: list[Segment] = []
        self.retried: list[str] = []
        self._chains = 0

    def route(self) -> list[Segment]:
        for position, call in enumerate(self.calls):
            self._place(position, call)
        self._settle_retries()
        return self.segments

    def _place(self, position: int, call: Call) -> None:
        matches = [(match, seg) for seg in self.segments if (match := self._match(seg, call.prompt))]
        if matches:
            (_, mode), segment = max(matches, key=lambda m: (m[0][0], m[1].last_seq))
            {"retry": self._retry, "extend": self._extend, "drop": self._drop}[mode](segment, call)
        elif (target := self._abandoned_tip(position, call)) is not None:
            self._resolve(target, lambda attempt: 0)
            self._open(call, target.chain, "canonical_prefix_break")
        else:
            self._open(call)

    def _match(self, segment: Segment, prompt: np.ndarray) -> tuple[int, str] | None:
        """(matched length, how the prompt continues the segment) or None."""
        tip = segment.tip
        if is_prefix(tip, prompt):
            return len(tip), "retry" if len(tip) == len(prompt) else "extend"
        if segment.turns[-1].call.empty_truncation:
            stripped = strip_generation_prompt(tip)
            if len(stripped) < len(tip) and is_prefix(stripped, prompt):
                return len(stripped), "drop"
        return None

    def _retry(self, segment: Segment, call: Call) -> None:
        segment.turns[-1].attempts.append(call)
        segment.last_seq = call.seq

    def _extend(self, segment: Segment, call: Call) -> None:
        tail = call.prompt[len(segment.tip):]
        eot_at = find_first(tail, self.eot) if self.eot is not None else -1
        if eot_at < 0:
            self._resolve(segment, lambda attempt: 0)
            reason = "eot_unavailable" if self.eot is None else "interstitial_split_failed"
            self._open(call, segment.chain, reason)
            return
        kept = self._resolve(segment, lambda attempt: _likeness(attempt, tail, eot_at, self.eot))
        canonical, before = _interstitial(kept, tail, eot_at, self.eot)
        segment.drift += drift(kept.sampled, canonical)
        self._append(segment, Turn(before, [call]))

    def _drop(self, segment: Segment, call: Call) -> None:
        """The harness dropped the empty truncated tip turn: leave it out, splice the new tail in."""
        stripped = len(strip_generation_prompt(segment.tip))
        generation_prompt = len(segment.tip) - stripped
        last = segment.turns[-1]
        if len(segment.turns) > 1 and len(last.before) < generation_prompt:
            self._resolve(segment, lambda attempt: 0)  # the generation prompt is not all interstitial
            self._open(call, segment.chain, "canonical_prefix_break")
            return
        segment.empty_truncations.append(self._resolve(segment, lambda attempt: 0).completion_id)
        segment.turns.pop()
        if not segment.turns:
            segment.prompt = call.prompt
            self._append(segment, Turn(EMPTY, [call]))
            return
        before = last.before[: len(last.before) - generation_prompt]
        self._append(segment, Turn(np.concatenate([before, call.prompt[stripped:]]), [call]))

    def _append(self, segment: Segment, turn: Turn) -> None:
        segment.turns.append(turn)
        segment.last_seq = turn.call.seq

    def _resolve(self, segment: Segment, score: Callable[[Call], int]) -> Call:
        """Keep the tip turn's best attempt (highest score, latest on a tie); split off the others."""
        turn = segment.turns[-1]
        if len(turn.attempts) > 1:
            best = max(range(len(turn.attempts)), key=lambda k: (score(turn.attempts[k]), k))
            for k, attempt in enumerate(turn.attempts):
                if k != best:
                    self._open(attempt, split_from=turn)
            turn.attempts = [turn.attempts[best]]
        return turn.call

    def _open(self, call: Call, chain: int | None = None, reason: str | None = None,
              split_from: Turn | None = None) -> None:
        if chain is None:
            chain, self._chains = self._chains, self._chains + 1
        index = sum(1 for seg in self.segments if seg.chain == chain)
        self.segments.append(Segment(chain, index, reason, call.prompt, [Turn(EMPTY, [call])], call.seq,
                                     split_from=split_from))

    def _abandoned_tip(self, position: int, call: Call) -> Segment | None:
        """The segment whose history this call rewrites (rule 2 of the module doc), if any."""
        candidates = []
        for segment in self.segments:
            shared = common_prefix_len(segment.tip, call.prompt)
            if shared < len(call.prompt) and shared >= self._first_message(segment.tip):
                candidates.append((shared, segment.last_seq, segment))
        for _, _, segment in sorted(candidates, key=lambda c: (c[0], c[1]), reverse=True):
            if not any(self._match(segment, later.prompt) for later in self.calls[position + 1:]):
                return segment
        return None

    def _first_message(self, tip: np.ndarray) -> int:
        """Length of the tip's first message (through its end-of-turn), else half the tip."""
        eot_at = find_first(tip, self.eot) if self.eot is not None else -1
        return eot_at + 1 if eot_at >= 0 else max(1, len(tip) // 2)

    def _settle_retries(self) -> None:
        """Unresolved tips keep their last attempt; lone split-offs nothing extended are retries."""
        for segment in self.segments:
            turn = segment.turns[-1]
            self._record_retries(turn, [attempt.completion_id for attempt in turn.attempts[:-1]])
            turn.attempts = turn.attempts[-1:]
        for segment in list(self.segments):
            alone = sum(1 for seg in self.segments if seg.chain == segment.chain) == 1
            if segment.split_from is not None and alone and len(segment.turns) == 1:
                segment.split_from.retried.extend(segment.turns[0].retried)
                self._record_retries(segment.split_from, [segment.turns[0].call.completion_id])
                self.segments.remove(segment)

    def _record_retries(self, turn: Turn, completion_ids: list[str]) -> None:
        turn.retried.extend(completion_ids)
        self.retried.extend(completion_ids)
