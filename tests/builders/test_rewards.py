"""The reward join: broadcast outcome rewards, match per-trace rewards, mark mismatches as errors."""

from __future__ import annotations

import json

import pytest
from sample_store import TRAJECTORIES, make_store
from tracetap.builders.rewards import join_session, load_rewards
from tracetap.store import StoreReader, write_session_table


def traces(n: int, status: str = "ok") -> list[dict]:
    return [{"session_id": "s1", "builder": "prefix_merging", "trace_index": i, "status": status,
             "reward": None, "metadata_json": json.dumps({"trace": {"turns": i}})} for i in range(n)]


def reward(value=None, trace_rewards=None, details=None) -> dict:
    return {"session_id": "s1", "evaluator": "ev", "reward": value, "trace_rewards": trace_rewards,
            "details_json": json.dumps(details or {})}


def evaluation(row: dict) -> dict:
    return json.loads(row["metadata_json"])["evaluation"]


@pytest.mark.parametrize("row, n, rewards", [
    (reward(0.7), 3, [0.7, 0.7, 0.7]),
    (reward(trace_rewards=[0.1, 0.2, 0.3]), 3, [0.1, 0.2, 0.3]),
    (reward(1.0, trace_rewards=[0.0, 0.5]), 2, [0.0, 0.5]),  # per-trace rewards win
    (reward(trace_rewards=[0.0, 0.5], details={"builder": "prefix_merging"}), 2, [0.0, 0.5]),
    (reward(0.5, details={"builder": "per_request"}), 2, [0.5, 0.5]),  # an outcome fits any builder
    (reward(), 2, [None, None]),  # the evaluator gave neither
])
def test_rewards_land_on_every_trace(row, n, rewards):
    joined = join_session(traces(n), row, "ev")
    assert [t["reward"] for t in joined] == rewards
    assert [t["status"] for t in joined] == ["ok"] * n
    assert [evaluation(t)["reward"] for t in joined] == rewards


@pytest.mark.parametrize("row, reason", [
    (reward(trace_rewards=[0.1, 0.2]), "trace_rewards has 2 values for 3 traces"),
    (reward(trace_rewards=[0.1, 0.2, 0.3, 0.4]), "trace_rewards has 4 values for 3 traces"),
    (reward(details={"error": "RuntimeError: boom"}), "evaluator failed: RuntimeError: boom"),
    (reward(trace_rewards=[1, 1, 1], details={"builder": "per_request"}),
     "trace_rewards were computed for builder per_request, not prefix_merging"),
])
def test_mismatch_or_failure_marks_the_session_error_without_dropping(row, reason):
    joined = join_session(traces(3), row, "ev")
    assert len(joined) == 3
    assert [t["status"] for t in joined] == ["error"] * 3
    assert [t["reward"] for t in joined] == [None] * 3
    assert all(evaluation(t)["error"] == reason for t in joined)


def test_unscored_session_keeps_null_rewards_and_says_so():
    joined = join_session(traces(2, "not_trainable"), None, "ev")
    assert [(t["reward"], t["status"]) for t in joined] == [(None, "not_trainable")] * 2
    assert evaluation(joined[0]) == {"evaluator": "ev", "reward": None, "missing": True}


def test_join_keeps_metadata_and_does_not_touch_its_input():
    original = traces(1)
    joined = join_session(original, reward(0.25), "ev")
    assert json.loads(joined[0]["metadata_json"])["trace"] == {"turns": 0}
    assert original[0]["reward"] is None and "evaluation" not in original[0]["metadata_json"]


def test_rewards_load_from_a_real_store_and_join_its_trajectories(tmp_path):
    root = make_store(tmp_path / "store")
    write_session_table(root, "rewards", "s1", [{"evaluator": "other", "reward": 0.3}], evaluator="other")
    reader = StoreReader(root)
    rewards = load_rewards(reader, "session_completed")
    assert sorted(rewards) == ["s1", "s2", "s3"]
    assert load_rewards(reader, "other")["s1"]["reward"] == 0.3
    assert load_rewards(reader, "missing") == {}
    joined = {sid: join_session(rows, rewards.get(sid), "session_completed")
              for sid, rows in TRAJECTORIES.items()}
    assert [t["reward"] for t in joined["s2"]] == [0.0, 0.0]
    assert [t["status"] for t in joined["s3"]] == ["error"]  # its evaluation failed
