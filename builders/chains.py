"""Route a session's calls into chains and segments by token prefixes (the core of prefix_merging).

Calls arrive in seq order. Every segment of every chain stays open, its *tip* being the prompt of
its latest turn. A call goes to:
1. the segment whose tip is the longest prefix of its prompt (ties: the most recently extended):
   - prompt == tip: another attempt at the tip turn (a retry, or a parallel sample);
   - prompt extends the tip: a new turn; the interstitial is the prompt's tail after the first
     end-of-turn token past the tip (that token included when the previous turn did not sample it,
     i.e. it was cut at `length`); no end-of-turn id known, or none in the tail: a break;
   - prompt extends the tip without the empty think block its generation prompt ended with
     (thinking disabled, see tokens.generation_prompt_block): a new turn as above, its copy starting
     where the block was, the block counted as `template` drift;
   - the tip's turn is an empty truncation (finish `length`, nothing visible to the harness) and
     the prompt extends the tip without its generation prompt: the harness dropped that turn; it
     is left out of the stream and the prompt's tail becomes interstitial;
2. else, when its prompt shares the whole first message of some tip (same system prompt: the same
   agent) and that tip is never extended later (the old history was abandoned, not paused): a new
   segment of that chain with break `canonical_prefix_break` (history rewritten, compaction);
3. else a new chain (a sub-agent, a parallel conversation, a fork from an earlier point).
A call repeating a tip's prompt is another attempt, unless an open tip it extends has an attempt whose
sampled ids its prompt repeats verbatim: then it is that thread's next turn (two identical sub-agents
run the same prompts). When a turn with several attempts is extended, the attempt whose sampled ids
the new prompt holds verbatim is kept, else the one sharing the most tokens with its copy (the latest
on a tie: a plain retry keeps the last attempt); the others open chains of their own. A retry is an
attempt with no continuation that a later attempt at the same prompt repeated: it is recorded and left
out. Any other attempt without continuation (a parallel sample after the one that was continued)
stays a one-turn chain.

Most calls are placed without a comparison: capture stores each prompt as the longest earlier
sequence (prompt + sampled ids) it extends plus a suffix (store.Prompts), so a call whose reference
covers the whole sequence of an attempt at a tip turn extends that tip verbatim (rule 1), unless
another tip starts with that one; only the new tail is then materialized. Every other call (drift,
a rewritten history, a sub-agent, a retry) goes through the comparisons above.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from tracetap.builders.base import Call
from tracetap.builders.drift import Decode, DriftSpan, template_drift, turn_drift
from tracetap.builders.tokens import (
    common_prefix_len,
    find_first,
    generation_prompt_block,
    is_prefix,
    shared_tokens,
    strip_generation_prompt,
)

EMPTY = np.zeros(0, dtype=np.int32)
BREAK_WINDOW = 24  # tokens kept on each side of a break, for viewers to show what changed


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

    @property
    def prompt_len(self) -> int:
        return self.attempts[0].prompt_len


@dataclass(frozen=True)
class Match:
    """How a prompt continues a segment: `length` tokens of its tip are matched."""

    length: int
    mode: str  # retry | extend | drop
    verbatim: bool = False  # extend: some attempt's sampled ids start the prompt's tail


@dataclass(frozen=True)
class BreakPoint:
    """Where a segment's first prompt leaves the tip of the segment it broke from."""

    completion_id: str  # the call whose prompt was the old tip
    position: int  # first index where the two prompts differ
    before: np.ndarray  # the shared tokens just before `position`
    was: np.ndarray  # the old tip from `position` on
    now: np.ndarray  # the new prompt from `position` on

    @classmethod
    def between(cls, broken: Segment, prompt: np.ndarray) -> BreakPoint:
        tip, at = broken.tip, common_prefix_len(broken.tip, prompt)
        window = slice(at, at + BREAK_WINDOW)
        return cls(broken.turns[-1].call.completion_id, at, tip[max(0, at - BREAK_WINDOW):at],
                   tip[window], prompt[window])

    def to_json(self) -> dict:
        return {"completion_id": self.completion_id, "position": self.position,
                "before": self.before.tolist(), "was": self.was.tolist(), "now": self.now.tolist()}


@dataclass
class Segment:
    """A run of turns whose prompts strictly extend each other; a break starts the next one."""

    chain: int
    index: int
    break_reason: str | None
    prompt: np.ndarray
    turns: list[Turn]
    last_seq: int
    drift: list[DriftSpan] = field(default_factory=list)
    empty_truncations: list[str] = field(default_factory=list)
    split_from: Turn | None = None  # opened by an earlier attempt another attempt won against
    break_point: BreakPoint | None = None

    @property
    def tip(self) -> np.ndarray:
        return self.turns[-1].prompt

    @property
    def tip_len(self) -> int:
        return self.turns[-1].prompt_len


def _ends_turn(call: Call, eot: int) -> bool:
    return len(call.sampled) > 0 and call.sampled[-1] == eot


def _interstitial(call: Call, tail: np.ndarray, eot_at: int, eot: int) -> tuple[np.ndarray, np.ndarray]:
    """(canonical copy of `call`'s turn, interstitial) in the next prompt's tail."""
    cut = eot_at + 1 if _ends_turn(call, eot) else eot_at
    return tail[:cut], tail[cut:]


def _likeness(call: Call, tail: np.ndarray, eot_at: int, eot: int) -> int:
    """How much of the turn's copy in the next prompt `call` sampled (end-of-turn left out)."""
    return shared_tokens(call.sampled[:-1] if _ends_turn(call, eot) else call.sampled, tail[:eot_at])


def _best(matches: list[tuple[Match, Segment]]) -> tuple[Match, Segment]:
    """The longest match, the most recently extended on a tie; a thread's verbatim next turn is never
    taken for a repeat of another tip."""
    if any(match.verbatim for match, _ in matches):
        matches = [(match, segment) for match, segment in matches if match.mode != "retry"]
    return max(matches, key=lambda pair: (pair[0].length, pair[1].last_seq))


class Router:
    """One pass over a session's calls; the result is `segments` (retries already left out).

    `decode` (ids -> text) tells tokenization drift from content drift; without it drift is `unknown`.
    """

    def __init__(self, calls: list[Call], eot: int | None, decode: Decode | None = None) -> None:
        self.calls, self.eot, self.decode = calls, eot, decode
        self.segments: list[Segment] = []
        self.retried: list[str] = []
        self._chains = 0

    def route(self) -> list[Segment]:
        for position, call in enumerate(self.calls):
            self._place(position, call)
        self._settle_retries()
        return self.segments

    def _place(self, position: int, call: Call) -> None:
        if (continued := self._continued(call)) is not None:
            self._extend(continued, call, Match(continued.tip_len, "extend", verbatim=True))
            return
        matches = [(match, seg) for seg in self.segments if (match := self._match(seg, call.prompt))]
        if matches:
            match, segment = _best(matches)
            {"retry": self._retry, "extend": self._extend, "drop": self._drop}[match.mode](segment, call, match)
        elif (target := self._abandoned_tip(position, call)) is not None:
            self._resolve(target)
            self._open(call, target.chain, "canonical_prefix_break", broken=target)
        else:
            self._open(call)

    def _continued(self, call: Call) -> Segment | None:
        """The segment `call` extends verbatim by what capture stored, when the comparison would pick it too.

        Capture stored the prompt as the whole sequence (prompt + sampled ids) of an attempt at a tip
        turn plus a suffix: it extends that tip, its tail starting with the attempt's sampled ids. No
        other segment can match as long unless that tip is a prefix of its own tip (every match is
        at most the tokens a tip shares with the prompt), so only those are compared, tip to tip.
        """
        ref, length = call.stored.ref, call.stored.length
        for segment in self.segments if ref is not None else ():
            attempt = next((a for a in segment.turns[-1].attempts if a.seq == ref), None)
            if attempt is not None:
                tip_len = segment.tip_len
                covered = len(attempt.sampled) > 0 and tip_len > 0 and length == tip_len + len(attempt.sampled)
                return segment if covered and not self._rivalled(segment) else None
        return None

    def _rivalled(self, segment: Segment) -> bool:
        """Whether another segment's tip starts with this one's (it might match a prompt as long)."""
        return any(other is not segment and other.tip_len >= segment.tip_len and is_prefix(segment.tip, other.tip)
                   for other in self.segments)

    def _match(self, segment: Segment, prompt: np.ndarray) -> Match | None:
        """How the prompt continues the segment, or None."""
        tip = segment.tip
        if is_prefix(tip, prompt):
            if len(tip) == len(prompt):
                return Match(len(tip), "retry")
            return Match(len(tip), "extend", self._verbatim(segment, prompt[len(tip):]))
        if segment.turns[-1].call.empty_truncation:
            stripped = strip_generation_prompt(tip)
            if len(stripped) < len(tip) and is_prefix(stripped, prompt):
                return Match(len(stripped), "drop")
        shared = len(tip) - generation_prompt_block(tip, prompt)
        if shared < len(tip):
            return Match(shared, "extend", self._verbatim(segment, prompt[shared:]))
        return None

    @staticmethod
    def _verbatim(segment: Segment, tail: np.ndarray) -> bool:
        return any(is_prefix(attempt.sampled, tail) for attempt in segment.turns[-1].attempts)

    def _retry(self, segment: Segment, call: Call, match: Match) -> None:
        segment.turns[-1].attempts.append(call)
        segment.last_seq = call.seq

    def _extend(self, segment: Segment, call: Call, match: Match) -> None:
        tail = call.tail(match.length)
        eot = self.eot
        eot_at = find_first(tail, eot) if eot is not None else -1
        if eot is None or eot_at < 0:
            self._resolve(segment)
            reason = "eot_unavailable" if self.eot is None else "interstitial_split_failed"
            self._open(call, segment.chain, reason, broken=segment)
            return
        kept = self._resolve(segment, lambda attempt: (is_prefix(attempt.sampled, tail),
                                                       _likeness(attempt, tail, eot_at, eot)))
        canonical, before = _interstitial(kept, tail, eot_at, eot)
        ids = (kept.completion_id, call.completion_id)
        if match.length < segment.tip_len:
            segment.drift.append(template_drift(segment.tip_len - match.length, match.length, ids))
        segment.drift += turn_drift(kept.sampled, canonical, match.length, ids, self.decode)
        self._append(segment, Turn(before, [call]))

    def _drop(self, segment: Segment, call: Call, match: Match) -> None:
        """The harness dropped the empty truncated tip turn: leave it out, splice the new tail in."""
        stripped = len(strip_generation_prompt(segment.tip))
        generation_prompt = len(segment.tip) - stripped
        last = segment.turns[-1]
        if len(segment.turns) > 1 and len(last.before) < generation_prompt:
            self._resolve(segment)  # the generation prompt is not all interstitial
            self._open(call, segment.chain, "canonical_prefix_break", broken=segment)
            return
        segment.empty_truncations.append(self._resolve(segment).completion_id)
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

    def _resolve(self, segment: Segment, score: Callable[[Call], tuple] | None = None) -> Call:
        """Keep the tip turn's best attempt (highest score, latest on a tie); split off the others.

        An attempt a later one repeated may be a retry (see _settle_retries); the last one never is.
        """
        turn = segment.turns[-1]
        if len(turn.attempts) > 1:
            last = len(turn.attempts) - 1
            best = last if score is None else max(range(last + 1), key=lambda k: (score(turn.attempts[k]), k))
            for k, attempt in enumerate(turn.attempts):
                if k != best:
                    self._open(attempt, split_from=turn if k < last else None)
            turn.attempts = [turn.attempts[best]]
        return turn.call

    def _open(self, call: Call, chain: int | None = None, reason: str | None = None,
              split_from: Turn | None = None, broken: Segment | None = None) -> None:
        if chain is None:
            chain, self._chains = self._chains, self._chains + 1
        index = sum(1 for seg in self.segments if seg.chain == chain)
        self.segments.append(Segment(
            chain, index, reason, call.prompt, [Turn(EMPTY, [call])], call.seq, split_from=split_from,
            break_point=BreakPoint.between(broken, call.prompt) if broken is not None else None))

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
