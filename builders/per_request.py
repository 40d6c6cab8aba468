"""per_request: one trace per ok completion, exactly as the upstream returned it.

Prompt = the call's prompt ids, response = its sampled ids (mask all 1), logprobs when aligned.
The baseline prefix_merging is measured against: every call is trained on its own full prompt.
"""

from __future__ import annotations

from tracetap.builders.base import base_stats, error_trace, prepare, session_fields, trace_row
from tracetap.builders.drift import Decode

NAME = "per_request"


def build_session(completions: list[dict], eot_id: int | None = None, session: dict | None = None,
                  decode: Decode | None = None) -> tuple[list[dict], dict]:
    """A session's traces (one per ok completion, seq order) and its stats; `eot_id` and `decode`
    are unused (each trace is one call as sampled: there is no copy to drift from)."""
    data = prepare(completions, session)
    stats = {**base_stats(NAME, data), "traces": len(data.calls) + len(data.unusable),
             "completions_preserved": len(data.calls)}
    fields = session_fields(data.rows)
    by_seq = {call.seq: call for call in data.calls}
    traces = []
    for row in data.rows:
        if row.get("status") != "ok":
            continue
        call = by_seq.get(int(row["seq"]))
        if call is None:
            traces.append(error_trace(NAME, row, "missing_token_ids", {"stats": stats}, **fields))
            continue
        traces.append(trace_row(NAME, call.prompt, [(call.sampled, call)], data.status, {"stats": stats},
                                **fields, completion_ids=[call.completion_id],
                                finish_reason=call.finish_reason))
    for index, trace in enumerate(traces):
        trace["trace_index"] = index
    return traces, stats
