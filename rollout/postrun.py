"""POSTRUN's store work for one session: build its traces, score it, join the reward into its traces.

Everything here is synchronous file work (the node runs it in a thread) and touches one session's
partitions only: `build` for that session, `evaluate_store` for that session, then the session's
trajectory file is rewritten with the reward joined (builders/rewards.py rules) and the rollout's
verdict in each trace's `metadata_json.rollout`, so a trace of a timed-out run says so.
"""

from __future__ import annotations

from pathlib import Path

from tracetap.builders.rewards import add_metadata, join_session
from tracetap.builders.runner import build
from tracetap.evaluators.runner import NO_TOOLS, SessionScore, SessionTools, evaluate_store
from tracetap.rollout.models import EvaluatorSpec
from tracetap.store import StoreReader, write_session_table


def build_session(store: Path, session_id: str, builder: str) -> int:
    """Build the session's traces with `builder`; returns how many."""
    return build(store, builder, session_ids=[session_id]).traces


def token_totals(store: Path, session_id: str) -> tuple[int, int]:
    """(prompt, sampled) tokens over the session's ok calls, from its sessions row."""
    row = StoreReader(store).session(session_id)
    return (row["prompt_tokens"] or 0, row["completion_tokens"] or 0) if row else (0, 0)


def score_session(store: Path, session_id: str, builder: str, evaluator: EvaluatorSpec,
                  timeout: float, tools: SessionTools = NO_TOOLS) -> SessionScore:
    """Evaluate one session (with its runtimes, when given) and write its rewards row."""
    [score] = evaluate_store(store, evaluator.name, evaluator.config, session_ids=[session_id], builder=builder,
                             timeout=timeout, tools=tools)
    return score


def finish_traces(store: Path, session_id: str, builder: str, score: SessionScore | None,
                  rollout: dict) -> None:
    """Rewrite the session's traces with the reward joined (when scored) and `rollout` in their metadata."""
    reader = StoreReader(store)
    traces = reader.trajectories(builder, [session_id]).to_pylist()
    if not traces:  # not built, or built without a trace: nothing to label
        return
    if score is not None:
        [reward_row] = reader.rewards(score.evaluator, [session_id])
        traces = join_session(traces, reward_row, reward_row["evaluator"])
    labelled = [{**row, "metadata_json": add_metadata(row.get("metadata_json"), rollout=rollout)} for row in traces]
    write_session_table(store, "trajectories", session_id, labelled, builder=builder, writer="tracetap rollout")
