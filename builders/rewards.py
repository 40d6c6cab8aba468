"""The reward join: put an evaluator's verdict for a session onto that session's traces.

Rules, per session:
- the evaluator failed (details carry `error`): every trace becomes status `error`, reward null;
- `trace_rewards` given: it must hold exactly one value per trace (of the builder it was computed
  for), and trace i gets value i; otherwise every trace of the session becomes status `error` with
  the reason in its metadata;
- else an outcome `reward` is broadcast to every trace;
- no reward row (never evaluated): rewards stay null and the metadata says so.
Traces are never dropped here; an error is a status plus a reason in `metadata_json.evaluation`.
"""

from __future__ import annotations

import json

from tracetap.store import Reader


def load_rewards(reader: Reader, evaluator: str) -> dict[str, dict]:
    """Each session's reward row for `evaluator` (the latest when a session was scored twice)."""
    return {row["session_id"]: row for row in reader.rewards(evaluator)}


def _details(reward_row: dict) -> dict | None:
    try:
        details = json.loads(reward_row.get("details_json") or "{}")
    except json.JSONDecodeError:
        return None
    return details if isinstance(details, dict) else None


def _rule_error(reward_row: dict, traces: list[dict]) -> str | None:
    """Why this session's reward cannot be joined, or None."""
    details = _details(reward_row)
    if details is None:
        return "evaluator details are not valid JSON"
    if details.get("error"):
        return f"evaluator failed: {details['error']}"
    trace_rewards = reward_row.get("trace_rewards")
    if trace_rewards is None:
        return None
    if len(trace_rewards) != len(traces):
        return f"trace_rewards has {len(trace_rewards)} values for {len(traces)} traces"
    scored, built = details.get("builder"), {t.get("builder") for t in traces}
    if scored and built and built != {scored}:  # same count, other traces: the values would be misplaced
        return f"trace_rewards were computed for builder {scored}, not {', '.join(sorted(map(str, built)))}"
    return None


def _join_rule(reward_row: dict | None, traces: list[dict]) -> tuple[list[float | None], str | None]:
    """(reward per trace, error reason or None) for one session's traces."""
    if reward_row is None:
        return [None] * len(traces), None
    error = _rule_error(reward_row, traces)
    if error:
        return [None] * len(traces), error
    if reward_row.get("trace_rewards") is not None:
        return list(reward_row["trace_rewards"]), None
    return [reward_row.get("reward")] * len(traces), None


def add_metadata(metadata_json: str | None, **fields) -> str:
    """`metadata_json` with `fields` added (top-level keys); shared by the join and the exports."""
    metadata = json.loads(metadata_json) if metadata_json else {}
    return json.dumps({**metadata, **fields})


def join_session(traces: list[dict], reward_row: dict | None, evaluator: str) -> list[dict]:
    """New trace rows (store shape) with `reward`, `status` and `metadata_json.evaluation` set."""
    rewards, error = _join_rule(reward_row, traces)
    joined = []
    for row, reward in zip(traces, rewards, strict=True):
        evaluation = {"evaluator": evaluator, "reward": reward}
        if reward_row is None:
            evaluation["missing"] = True
        if error:
            evaluation["error"] = error
        joined.append({
            **row,
            "reward": reward,
            "status": "error" if error else row.get("status"),
            "metadata_json": add_metadata(row.get("metadata_json"), evaluation=evaluation),
        })
    return joined
