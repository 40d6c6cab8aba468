"""test_on_output: parse pytest-style outcomes, run a real pytest in a workspace, timeouts, config errors."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest
from tracetap.evaluators.base import EvalInput, EvaluatorError
from tracetap.evaluators.test_on_output import TestOnOutput, parse_test_output

# plugin autoload off: a bare pytest starts in well under a second
PYTEST = f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {sys.executable} -m pytest -v -rA -p no:cacheprovider"
PROJECT = {
    "calc.py": "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a + b  # the bug\n",
    "test_calc.py": textwrap.dedent("""
        import pytest
        from calc import add, sub

        def test_add():
            assert add(2, 3) == 5

        def test_sub():
            assert sub(5, 3) == 2

        @pytest.mark.skip(reason="not today")
        def test_later():
            pass

        @pytest.mark.parametrize("x", [1, 2])
        def test_param(x):
            assert x == 1

        @pytest.fixture
        def broken():
            raise RuntimeError("setup fails")

        def test_uses_broken(broken):
            pass
    """),
}
ACTUAL = {
    "test_calc.py::test_add": "PASSED",
    "test_calc.py::test_sub": "FAILED",
    "test_calc.py::test_later": "SKIPPED",
    "test_calc.py::test_param[1]": "PASSED",
    "test_calc.py::test_param[2]": "FAILED",
    "test_calc.py::test_uses_broken": "ERROR",
}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    for name, text in PROJECT.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def run(workspace: Path | None, budget: float = 60.0, **config):
    evaluator = TestOnOutput()
    checked = evaluator.check_config({"test_command": PYTEST, "expected": ACTUAL, **config})
    return evaluator.evaluate(EvalInput("s1", "t1", workspace, [], [], budget, checked))


@pytest.mark.parametrize("text, outcomes", [
    ("tests/test_a.py::test_one PASSED                    [ 50%]", {"tests/test_a.py::test_one": "PASSED"}),
    ("FAILED tests/test_a.py::test_two - assert 1 == 2", {"tests/test_a.py::test_two": "FAILED"}),
    ("ERROR tests/test_b.py - ImportError: no module", {"tests/test_b.py": "ERROR"}),
    ("\x1b[32mPASSED\x1b[0m t.py::test_c", {"t.py::test_c": "PASSED"}),
    ("[gw1] [ 25%] PASSED t.py::test_d", {"t.py::test_d": "PASSED"}),
    ("t.py::test_e[a b] FAILED                           [ 10%]", {"t.py::test_e[a b]": "FAILED"}),
    ("t.py::Cls::test_f SKIPPED (no reason)   [ 20%]", {"t.py::Cls::test_f": "SKIPPED"}),
    ("t.py::test_g PASSED\nt.py::test_g ERROR", {"t.py::test_g": "ERROR"}),  # failed teardown wins
    ("SKIPPED [1] t.py:12: not today", {}),
    ("PASSED all the things\n=== 3 passed in 0.1s ===", {}),
])
def test_parse_test_output(text, outcomes):
    assert parse_test_output(text) == outcomes


def test_real_pytest_run_meets_every_expected_outcome(workspace):
    result = run(workspace)
    assert result.reward == 1.0, result.details["output_tail"]
    assert result.details["met"] == len(ACTUAL) and result.details["mismatches"] == {}
    assert result.details["exit_code"] == 1  # failures were expected: the exit code does not count
    assert result.details["timed_out"] is False


# one expectation changed, one added: all but one of the original outcomes are met
@pytest.mark.parametrize("scoring, reward", [("fraction", (len(ACTUAL) - 1) / (len(ACTUAL) + 1)),
                                             ("all_or_nothing", 0.0)])
def test_unmet_expectations_lower_the_reward(workspace, scoring, reward):
    expected = {**ACTUAL, "test_calc.py::test_sub": "PASSED", "test_calc.py::test_missing": "PASSED"}
    result = run(workspace, expected=expected, scoring=scoring)
    assert result.reward == pytest.approx(reward)
    assert result.details["mismatches"] == {
        "test_calc.py::test_sub": {"expected": "PASSED", "got": "FAILED"},
        "test_calc.py::test_missing": {"expected": "PASSED", "got": None},
    }


def test_fixed_workspace_scores_its_fix(workspace):
    fixed = PROJECT["calc.py"].replace("return a + b  # the bug", "return a - b")
    (workspace / "calc.py").write_text(fixed)
    result = run(workspace, expected={"test_calc.py::test_sub": "PASSED"})
    assert result.reward == 1.0


@pytest.mark.parametrize("config, budget", [({"timeout": 0.5}, 60.0), ({"timeout": 100}, 0.5)])
def test_timeout_kills_the_run_and_scores_zero(workspace, config, budget):
    started = time.monotonic()
    result = run(workspace, budget=budget, test_command="sleep 30 & sleep 30; echo never", **config)
    assert time.monotonic() - started < 10  # the whole process group died, pipes closed
    assert result.reward == 0.0
    assert result.details["timed_out"] is True and result.details["timeout_s"] == 0.5
    assert "never" not in result.details["output_tail"]


def test_expected_may_be_a_json_string(workspace):
    result = run(workspace, expected='{"test_calc.py::test_add": "passed"}')
    assert result.reward == 1.0


def test_missing_workspace_is_an_error(tmp_path):
    with pytest.raises(EvaluatorError, match="no workspace"):
        run(None)
    with pytest.raises(EvaluatorError, match="no workspace"):
        run(tmp_path / "gone")


@pytest.mark.parametrize("config, message", [
    ({"expected": ACTUAL}, "test_command"),
    ({"test_command": "true"}, "non-empty map"),
    ({"test_command": "true", "expected": {}}, "non-empty map"),
    ({"test_command": "true", "expected": "{oops"}, "not valid JSON"),
    ({"test_command": "true", "expected": {"a": "GREEN"}}, "must be one of"),
    ({"test_command": "true", "expected": ACTUAL, "scoring": "most"}, "scoring"),
    ({"test_command": "true", "expected": ACTUAL, "timeout": -1}, "positive"),
    ({"test_command": "true", "expected": ACTUAL, "timeout": "soon"}, "number of seconds"),
    ({"test_command": "true", "expected": ACTUAL, "tset_command": "x"}, "unknown config key"),
])
def test_config_errors(config, message):
    with pytest.raises(EvaluatorError, match=message):
        TestOnOutput().check_config(config)
