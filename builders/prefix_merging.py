"""prefix_merging: one trace per segment of each chain of a session (DESIGN §7).

A trace's prompt is its first call's prompt; its response is, turn by turn, the interstitial context
taken from the next prompt (mask 0, logprob 0.0) and the sampled ids (mask 1, real logprobs). How
calls are routed into chains and segments is in builders/chains.py. Nothing is dropped: a break
starts a new segment (a new trace) with its reason and where the prompts part; retried attempts and
empty truncations the harness dropped from its history are counted and named in the metadata. Drift
(builders/drift.py) is listed per trace in spans with their kind; a trace whose content drifted is
`not_trainable`.
"""

from __future__ import annotations

from collections import Counter

from tracetap.builders.base import base_stats, error_trace, prepare, session_fields, trace_row
from tracetap.builders.chains import Router, Segment
from tracetap.builders.drift import Decode
from tracetap.builders.tokens import resolve_eot
from tracetap.builders.trainability import drift_reasons

NAME = "prefix_merging"


def _ordered(segments: list[Segment]) -> list[tuple[int, Segment]]:
    """(chain index, segment) with chains numbered by the seq of their first call."""
    first_seq: dict[int, int] = {}
    for segment in segments:
        first_seq[segment.chain] = min(first_seq.get(segment.chain, segment.turns[0].call.seq),
                                       segment.turns[0].call.seq)
    number = {chain: i for i, chain in enumerate(sorted(first_seq, key=first_seq.__getitem__))}
    return sorted(((number[s.chain], s) for s in segments), key=lambda pair: (pair[0], pair[1].index))


def _drift_reasons(segment: Segment) -> list[str]:
    return drift_reasons(span.kind for span in segment.drift)


def _drift_by_kind(segments: list[Segment]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for segment in segments:
        for span in segment.drift:
            counts[span.kind] += span.tokens
    return dict(counts)


def _stats(data, segments: list[Segment], retried: list[str], eot: int | None, source: str | None) -> dict:
    turns = sum(len(segment.turns) for segment in segments)
    reasons = list(dict.fromkeys([*data.reasons, *(r for segment in segments for r in _drift_reasons(segment))]))
    by_kind = _drift_by_kind(segments)
    return {
        **base_stats(NAME, data),
        "trainable": not reasons,
        "not_trainable_reasons": reasons,
        "chains": len({segment.chain for segment in segments}),
        "segments": len(segments),
        "traces": len(segments) + len(data.unusable),
        "completions_preserved": turns,
        "completions_merged": turns - len(segments),
        "retries": len(retried),
        "empty_truncations": sum(len(segment.empty_truncations) for segment in segments),
        "break_reasons": dict(Counter(s.break_reason for s in segments if s.break_reason)),
        "drift_tokens": sum(by_kind.values()),
        "drift_tokens_by_kind": by_kind,
        "eot_id": eot,
        "eot_source": source,
    }


def _trace(segment: Segment, chain: int, session_reasons: list[str], stats: dict, fields: dict) -> dict:
    parts = []
    for turn in segment.turns:
        parts += [(turn.before, None), (turn.call.sampled, turn.call)]
    reasons = session_reasons + _drift_reasons(segment)
    trace = {
        "turns": len(segment.turns),
        "drift_tokens": sum(span.tokens for span in segment.drift),
        "drift": [span.to_json() for span in segment.drift],
        "not_trainable_reasons": reasons,
        "break": segment.break_point.to_json() if segment.break_point is not None else None,
        "retried_completion_ids": [cid for turn in segment.turns for cid in turn.retried],
        "empty_truncation_ids": segment.empty_truncations,
    }
    status = "not_trainable" if reasons else "ok"
    return trace_row(NAME, segment.prompt, parts, status, {"trace": trace, "stats": stats}, **fields,
                     chain_index=chain, segment_index=segment.index, break_reason=segment.break_reason,
                     completion_ids=[turn.call.completion_id for turn in segment.turns],
                     finish_reason=segment.turns[-1].call.finish_reason)


def merge_session(completions: list[dict], eot_id: int | None = None, session: dict | None = None,
                  decode: Decode | None = None) -> tuple[list[dict], dict]:
    """A session's traces (`trajectories` rows, in trace order) and its reconstruction stats.

    `completions`: the session's `completions` rows, any status (failed ones only inform
    trainability). `eot_id`: the end-of-turn token; detected when None. `session`: its `sessions`
    row, for the upstream failure counters. `decode`: ids -> text with the model's tokenizer, to
    tell tokenization drift from content drift.
    """
    data = prepare(completions, session)
    eot, source = resolve_eot(data.rows, eot_id)
    router = Router(data.calls, eot, decode)
    segments = router.route()
    stats = _stats(data, segments, router.retried, eot, source)
    fields = session_fields(data.rows)
    traces = [_trace(segment, chain, data.reasons, stats, fields) for chain, segment in _ordered(segments)]
    traces += [error_trace(NAME, row, "missing_token_ids", {"stats": stats}, **fields)
               for row in data.unusable]
    for index, trace in enumerate(traces):
        trace["trace_index"] = index
    return traces, stats
