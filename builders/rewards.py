"""The reward join: put an evaluator's verdict for a session onto that session's traces.

Rules, per session:
- the evaluator failed (details carry `error`): every trace becomes status `error`, reward null;
- `trace_rewards` given: it must hold exactly one value per trace, and trace i gets value i;
  otherwise every trace of the session becomes status `error` with the reason in its metadata;
- else an outcome `reward` is broadcast to every trace;
- no reward row (never evaluated): rewards stay null and the metadata says so.
Traces are never dropped here; an error is a status plus a reason in `metadata_json.evaluation`.
"""

from __future__ import annotations

import json

import duckdb


def load_rewards(con: duckdb.DuckDBPyConnection, evaluator: str) -> dict[str, dict]:
    """Each session's reward row for `evaluator` (the latest when a session was scored twice)."""
    rows = con.execute(
        "SELECT session_id, evaluator, reward, trace_rewards, details_json FROM rewards "
        "WHERE evaluator = $evaluator ORDER BY session_id, created_at",
        {"evaluator": evaluator},
    ).fetchall()
    columns = ("session_id", "evaluator", "reward", "trace_rewards", "details_json")
    return {row[0]: dict(zip(columns, row, strict=True)) for row in rows}


def _evaluator_error(reward_row: dict) -> str | None:
    try:
        details = json.loads(reward_row.get("details_json") or "{}")
    except json.JSONDecodeError:
        return "evaluator details are not valid JSON"
    error = details.get("error") if isinstance(details, dict) else None
    return f"evaluator failed: {error}" if error else None


def _join_rule(reward_row: dict | None, traces: int) -> tuple[list[float | None], str | None]:
    """(reward per trace, error reason or None) for a session with `traces` traces."""
    if reward_row is None:
        return [None] * traces, None
    error = _evaluator_error(reward_row)
    if error:
        return [None] * traces, error
    trace_rewards = reward_row.get("trace_rewards")
    if trace_rewards is not None:
        if len(trace_rewards) != traces:
            return [None] * traces, f"trace_rewards has {len(trace_rewards)} values for {traces} traces"
        return list(trace_rewards), None
    return [reward_row.get("reward")] * traces, None


def add_metadata(metadata_json: str | None, **fields) -> str:
    """`metadata_json` with `fields` added (top-level keys); shared by the join and the exports."""
    metadata = json.loads(metadata_json) if metadata_json else {}
    return json.dumps({**metadata, **fields})


def join_session(traces: list[dict], reward_row: dict | None, evaluator: str) -> list[dict]:
    """New trace rows (store shape) with `reward`, `status` and `metadata_json.evaluation` set."""
    rewards, error = _join_rule(reward_row, len(traces))
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
