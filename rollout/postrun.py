"""POSTRUN's store work for one session: build its traces, score it, join the reward into its traces.

Everything here is synchronous file work (the node runs it in a thread) and touches one session's
partitions only: `build` for that session, `evaluate_store` for that session, then the session's
trajectory file is rewritten with the reward joined (builders/rewards.py rules) and the rollout's
verdict in each trace's `metadata_json.rollout`, so a trace of a timed-out run says so.
"""

from __future__ import annotations

from pathlib import Path

from tracetap.builders.rewards import add_metadata, join_session
from tracetap.builders.runner import OUTPUT_FILE, build
from tracetap.evaluators.runner import NO_TOOLS, SessionScore, SessionTools, evaluate_store
from tracetap.rollout.models import EvaluatorSpec
from tracetap.store.files import read_parquet
from tracetap.store.paths import session_dir, session_file
from tracetap.store.schema import REWARDS, SESSIONS, TRAJECTORIES
from tracetap.store.tables import write_session_table


def build_session(store: Path, session_id: str, builder: str) -> int:
    """Build the session's traces with `builder`; returns how many."""
    return build(store, builder, session_ids=[session_id]).traces


def token_totals(store: Path, session_id: str) -> tuple[int, int]:
    """(prompt, sampled) tokens over the session's ok calls, from its sessions row."""
    path = session_file(store, session_id)
    rows = read_parquet([path], SESSIONS, ["prompt_tokens", "completion_tokens"]).to_pylist() if path.exists() else []
    return (rows[0]["prompt_tokens"] or 0, rows[0]["completion_tokens"] or 0) if rows else (0, 0)


def score_session(store: Path, session_id: str, builder: str, evaluator: EvaluatorSpec,
                  timeout: float, tools: SessionTools = NO_TOOLS) -> SessionScore:
    """Evaluate one session (with its runtimes, when given) and write its rewards row."""
    [score] = evaluate_store(store, evaluator.name, evaluator.config, session_ids=[session_id], builder=builder,
                             timeout=timeout, tools=tools)
    return score


def _traces(store: Path, session_id: str, builder: str) -> tuple[Path, list[dict]]:
    path = session_dir(store, "trajectories", session_id, builder) / OUTPUT_FILE
    rows = read_parquet([path], TRAJECTORIES).to_pylist() if path.exists() else []
    return path, sorted(rows, key=lambda row: row["trace_index"])


def finish_traces(store: Path, session_id: str, builder: str, score: SessionScore | None,
                  rollout: dict) -> None:
    """Rewrite the session's traces with the reward joined (when scored) and `rollout` in their metadata."""
    path, traces = _traces(store, session_id, builder)
    if not path.exists():
        return
    if score is not None:
        [reward_row] = read_parquet([score.path], REWARDS).to_pylist()
        traces = join_session(traces, reward_row, reward_row["evaluator"])
    labelled = [{**row, "metadata_json": add_metadata(row.get("metadata_json"), rollout=rollout)} for row in traces]
    write_session_table(store, "trajectories", session_id, labelled, OUTPUT_FILE, builder=builder)
