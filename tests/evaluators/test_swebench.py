"""swebench: instance checks, build artefacts dropped from patches, SWE-bench's log parser and grading."""

from __future__ import annotations

import json

import pytest
from tracetap.evaluators import swebench
from tracetap.evaluators.base import EvalInput, EvaluatorError, create
from tracetap.evaluators.swebench import drop_excluded, grade_tests, marked_output, parse_pytest_log

INSTANCE = {"instance_id": "calc-1", "repo": "o/calc", "base_commit": "abc", "test_patch": "diff --git a/t b/t\n",
            "FAIL_TO_PASS": '["t.py::test_a"]', "PASS_TO_PASS": []}
SOURCE = "diff --git a/calc.py b/calc.py\nindex 1..2 100644\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-a\n+b\n"
PYC = ("diff --git a/__pycache__/calc.cpython-311.pyc b/__pycache__/calc.cpython-311.pyc\nnew file mode 100644\n"
       "Binary files /dev/null and b/__pycache__/calc.cpython-311.pyc differ\n")
NESTED = "diff --git a/pkg/.pytest_cache/v/x b/pkg/.pytest_cache/v/x\nnew file mode 100644\n+x\n"
LOG = """\
>>>>> Start Test Output
============================= test session starts ==============================
tests/test_calc.py ..F.s                                                    [100%]
=========================== short test summary info ============================
PASSED tests/test_calc.py::test_neg
PASSED tests/test_calc.py::test_sub
FAILED tests/test_calc.py::test_add - assert -1 == 5
SKIPPED [1] tests/test_calc.py:20: later
XFAIL tests/test_calc.py::test_known - reason
>>>>> End Test Output
"""


def test_instance_lists_decode_and_missing_fields_are_named() -> None:
    config = create("swebench").check_config({"instance": json.dumps(INSTANCE)})
    assert config["instance"]["FAIL_TO_PASS"] == ["t.py::test_a"] and config["instance"]["PASS_TO_PASS"] == []
    assert (config["repo_dir"], config["apply_timeout"], config["test_timeout"]) == ("/testbed", 60.0, 1200.0)
    bad = {k: v for k, v in INSTANCE.items() if k not in ("base_commit", "test_patch")}
    with pytest.raises(EvaluatorError, match="lacks base_commit, test_patch"):
        create("swebench").check_config({"instance": bad})
    with pytest.raises(EvaluatorError, match="FAIL_TO_PASS is not valid JSON"):
        create("swebench").check_config({"instance": {**INSTANCE, "FAIL_TO_PASS": "[oops"}})
    with pytest.raises(EvaluatorError, match="required"):
        create("swebench").check_config({})


def test_build_artefacts_are_dropped_at_any_depth() -> None:
    patch, dropped = drop_excluded(PYC + SOURCE + NESTED, ["__pycache__", "*.pyc", "*.pyo", ".pytest_cache"])
    assert patch == SOURCE
    assert dropped == ["__pycache__/calc.cpython-311.pyc", "pkg/.pytest_cache/v/x"]
    assert drop_excluded(PYC, ["__pycache__"]) == ("", ["__pycache__/calc.cpython-311.pyc"])
    assert swebench.patch_files(SOURCE + NESTED) == ["calc.py", "pkg/.pytest_cache/v/x"]


def test_pytest_log_parsed_like_swebench() -> None:
    status = parse_pytest_log(marked_output(LOG))
    assert status == {"tests/test_calc.py::test_neg": "PASSED", "tests/test_calc.py::test_sub": "PASSED",
                      "tests/test_calc.py::test_add": "FAILED", "[1]": "SKIPPED",
                      "tests/test_calc.py::test_known": "XFAIL"}
    assert marked_output(LOG.replace(">>>>> End Test Output", "")) is None


@pytest.mark.parametrize("status, f2p, p2p, expected", [
    ({"a": "PASSED", "b": "PASSED"}, ["a"], ["b"], "RESOLVED_FULL"),
    ({"a": "XFAIL", "b": "SKIPPED"}, ["a"], ["b"], "RESOLVED_FULL"),   # a skipped PASS_TO_PASS passes
    ({"a": "SKIPPED", "b": "PASSED"}, ["a"], ["b"], "RESOLVED_NO"),    # a skipped FAIL_TO_PASS fails
    ({"a": "PASSED", "b": "FAILED"}, ["a"], ["b"], "RESOLVED_NO"),
    ({"a": "PASSED"}, ["a"], ["b"], "RESOLVED_NO"),                    # a test missing from the log fails
    ({"a": "PASSED", "c": "ERROR"}, ["a", "c"], [], "RESOLVED_PARTIAL"),
    ({}, [], [], "RESOLVED_FULL"),                                     # empty lists count as all passing
])
def test_resolution_by_swebench_rules(status: dict, f2p: list, p2p: list, expected: str) -> None:
    assert swebench.resolution(grade_tests(status, f2p, p2p)) == expected


def test_offline_there_is_no_runtime_and_the_error_says_so() -> None:
    evaluator = create("swebench")
    inp = EvalInput(session_id="s", task_id=None, workspace=None, trajectory=[], completions=[],
                    timeout_seconds=10, config=evaluator.check_config({"instance": INSTANCE}))
    with pytest.raises(EvaluatorError, match="runs only in a rollout"):
        evaluator.evaluate(inp)
