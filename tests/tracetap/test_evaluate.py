"""`tracetap evaluate` through click's runner on a real store."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner
from sample_store import make_store
from tracetap.store import connect

from tracetap.cli import cli

PYTEST = f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {sys.executable} -m pytest -v -p no:cacheprovider"  # fast start


@pytest.fixture
def store(tmp_path) -> str:
    return str(make_store(tmp_path / "store", rewards=False))


def run(*args: str, code: int = 0):
    result = CliRunner().invoke(cli, ["evaluate", *args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def test_session_completed_writes_rewards(store):
    result = run("--store", store, "--evaluator", "session_completed", "--json")
    rows = json.loads(result.stdout)
    got = [(r["session_id"], r["reward"], r["error"]) for r in rows]
    assert got == [("s1", 1.0, None), ("s2", 0.0, None), ("s3", 0.0, None)]
    assert "3 session(s) scored with session_completed; 0 evaluation(s) failed" in result.output
    stored = connect(store).sql("SELECT session_id, reward FROM rewards ORDER BY 1").fetchall()
    assert stored == [("s1", 1.0), ("s2", 0.0), ("s3", 0.0)]


def test_test_on_output_with_config_workspace_and_session(store, tmp_path):
    (tmp_path / "ws" / "s2").mkdir(parents=True)
    (tmp_path / "ws" / "s2" / "test_it.py").write_text("def test_it():\n    assert 1 + 1 == 3\n")
    result = run("--store", store, "--evaluator", "test_on_output", "--session", "s2",
                 "--workspace-root", str(tmp_path / "ws"), "--timeout", "60",
                 "--config", f"test_command={PYTEST}",
                 "--config", 'expected={"test_it.py::test_it": "FAILED"}',
                 "--config", "scoring=all_or_nothing")
    assert result.stdout.splitlines()[2].split()[:2] == ["s2", "1"]
    assert connect(store).sql("SELECT session_id, reward FROM rewards").fetchall() == [("s2", 1.0)]


def test_failed_evaluations_are_reported_not_fatal(store, tmp_path):
    result = run("--store", store, "--evaluator", "test_on_output", "--workspace-root", str(tmp_path),
                 "--config", "test_command=true", "--config", 'expected={"a::b": "PASSED"}')
    assert "3 evaluation(s) failed" in result.output and "no workspace directory" in result.stdout


@pytest.mark.parametrize("args, code, message", [
    (["--evaluator", "nope"], 1, "unknown evaluator 'nope'"),
    (["--evaluator", "test_on_output"], 1, "test_command"),
    (["--evaluator", "session_completed", "--config", "novalue"], 2, "expected KEY=VALUE"),
    (["--evaluator", "test_on_output", "--config", "expected={oops"], 2, "is not valid JSON"),
    (["--evaluator", "session_completed", "--session", "zz"], 1, "no such session(s) in the store: zz"),
    (["--evaluator", "session_completed", "--timeout", "0"], 2, "--timeout"),
    (["--evaluator", "session_completed", "--workspace-root", "/no/such/dir"], 2, "--workspace-root"),
])
def test_errors(store, args, code, message):
    assert message in run("--store", store, *args, code=code).output
    assert connect(store).sql("SELECT count(*) FROM rewards").fetchall() == [(0,)]


def test_not_a_store(tmp_path):
    assert "not a tracetap store" in run("--store", str(tmp_path), "--evaluator", "session_completed",
                                         code=2).output
