"""Scoring a real store: rewards files, workspaces, failures recorded, bad input refused up front."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from sample_store import TRAJECTORIES, make_store
from tracetap.evaluators.base import EvaluatorError
from tracetap.evaluators.runner import evaluate_store, workspace_for
from tracetap.store import StoreWriter, connect

TEST_FILE = "def test_ok():\n    assert True\n"
PYTEST = f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {sys.executable} -m pytest -v -p no:cacheprovider"  # fast start
CONFIG = {"test_command": PYTEST, "expected": {"test_ok.py::test_ok": "PASSED"}}


@pytest.fixture
def root(tmp_path):
    return make_store(tmp_path / "store", rewards=False)


def stored(root) -> dict[str, dict]:
    rows = connect(root).sql("SELECT * FROM rewards").to_arrow_table().to_pylist()
    return {row["session_id"]: {**row, "details": json.loads(row["details_json"])} for row in rows}


def test_session_completed_scores_every_session(root):
    scores = evaluate_store(root, "session_completed", {})
    assert [(s.session_id, s.reward, s.error) for s in scores] == [("s1", 1.0, None), ("s2", 0.0, None),
                                                                   ("s3", 0.0, None)]
    rewards = stored(root)
    assert set(rewards) == {"s1", "s2", "s3"}
    assert all(r["evaluator"] == "session_completed" for r in rewards.values())
    assert {score.evaluator for score in scores} == {"session_completed"}
    assert rewards["s2"]["details"]["trace_count"] == len(TRAJECTORIES["s2"])
    assert rewards["s2"]["details"]["builder"] == "prefix_merging"
    assert rewards["s2"]["details"]["reason"] == "last ok completion did not stop naturally"


def test_workspace_root_and_missing_workspaces(root, tmp_path):
    (tmp_path / "ws" / "s1").mkdir(parents=True)
    (tmp_path / "ws" / "s1" / "test_ok.py").write_text(TEST_FILE)
    scores = evaluate_store(root, "test_on_output", CONFIG, session_ids=["s1", "s2"],
                            workspace_root=tmp_path / "ws", timeout=60)
    assert scores[0].reward == 1.0 and scores[0].error is None
    assert scores[1].reward is None and "no workspace directory for session s2" in scores[1].error
    rewards = stored(root)
    assert rewards["s2"]["reward"] is None and "no workspace" in rewards["s2"]["details"]["error"]
    assert "s3" not in rewards


def test_workspace_from_session_metadata(tmp_path):
    workspace = tmp_path / "somewhere"
    workspace.mkdir()
    (workspace / "test_ok.py").write_text(TEST_FILE)
    with StoreWriter(tmp_path / "store") as writer:
        writer.register_session("w1", metadata={"workspace": str(workspace)})
        writer.record_completion({"session_id": "w1", "status": "ok", "finish_reason": "stop"})
    (score,) = evaluate_store(tmp_path / "store", "test_on_output", CONFIG)
    assert score.reward == 1.0
    assert workspace_for({"session_id": "w1", "metadata_json": None}, None) is None
    assert workspace_for({"session_id": "w1"}, tmp_path / "ws") == tmp_path / "ws" / "w1"


def test_custom_evaluator_gets_its_trajectory_and_failures_are_recorded(root, tmp_path, monkeypatch):
    (tmp_path / "custom_evals.py").write_text(textwrap.dedent('''
        from tracetap.evaluators.base import EvalResult, Evaluator

        class PerTrace(Evaluator):
            name = "per_trace"
            def evaluate(self, inp):
                if inp.session_id == "s3":
                    raise RuntimeError("grader crashed")
                if inp.session_id == "s2":
                    return {"reward": 1}
                return EvalResult(trace_rewards=[t["trace_index"] + 0.5 for t in inp.trajectory],
                                  details={"completions": len(inp.completions)})
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    scores = {s.session_id: s for s in evaluate_store(root, "custom_evals:PerTrace", {})}
    assert scores["s1"].trace_rewards == [0.5] and scores["s1"].error is None
    assert scores["s2"].error == "evaluate() returned dict, not EvalResult"
    assert scores["s3"].error == "RuntimeError: grader crashed"
    rewards = stored(root)
    assert rewards["s1"]["trace_rewards"] == [0.5] and rewards["s1"]["details"]["completions"] == 4
    assert rewards["s3"]["reward"] is None
    assert rewards["s3"]["details"]["error"] == "RuntimeError: grader crashed"


@pytest.mark.parametrize("spec, config, sessions, message", [
    ("test_on_output", {}, None, "test_command"),
    ("nope", {}, None, "unknown evaluator"),
    ("session_completed", {}, ["s1", "zz"], "no such session"),
])
def test_bad_input_fails_before_any_reward_is_written(root, spec, config, sessions, message):
    with pytest.raises(EvaluatorError, match=message):
        evaluate_store(root, spec, config, session_ids=sessions)
    assert stored(root) == {}
