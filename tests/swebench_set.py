"""A tiny SWE-bench-format task set made here: a small git repository and three instances on it.

`make_task_set(DIR)` writes `DIR/context/testbed` (the repository, history included; `DIR/context` is a
task-image build context that copies it to /testbed) and `DIR/instances.jsonl`. Commits are made with fixed
names and dates, so the base commit (and the image tag built from the context) is the same on every run.
Each instance has the scripted agent command that plays it: `calc-add` is resolved, `calc-mul` is fixed
but breaks `neg` (a PASS_TO_PASS test), `calc-sub` gets only a `__pycache__` (an empty patch once build
artefacts are dropped). Run as a script: `python tests/swebench_set.py DIR`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CALC = '''def add(a, b):
    return a - b


def sub(a, b):
    return a - b


def mul(a, b):
    return a + b


def neg(a):
    return -a
'''
TESTS = '''from calc import neg, sub


def test_neg():
    assert neg(2) == -2


def test_sub():
    assert sub(5, 3) == 2
'''
DOCKERFILE = "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nCOPY testbed /testbed\nWORKDIR /testbed\n"
GIT_ENV = {"GIT_AUTHOR_NAME": "tracetap", "GIT_AUTHOR_EMAIL": "tests@tracetap.invalid",
           "GIT_COMMITTER_NAME": "tracetap", "GIT_COMMITTER_EMAIL": "tests@tracetap.invalid",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
PYCACHE = "python3 -c 'import calc'"  # leaves __pycache__/calc.*.pyc behind: a build artefact
# instance id -> (problem, the fix the gold patch makes, the test it adds, the agent's command)
CASES = {
    "calc-add": ("add() returns the difference of its arguments.", ("add", "a - b", "a + b"),
                 "def test_add():\n    assert add(2, 3) == 5\n",
                 f"sed -i '/def add/,/return/ s/a - b/a + b/' calc.py && {PYCACHE}"),
    "calc-mul": ("mul() adds instead of multiplying.", ("mul", "a + b", "a * b"),
                 "def test_mul():\n    assert mul(2, 3) == 6\n",
                 "sed -i '/def mul/,/return/ s/a + b/a * b/; /def neg/,/return/ s/-a/a/' calc.py"),
    "calc-sub": ("sub() must accept a third argument.",
                 ("sub", "(a, b):\n    return a - b", "(a, b, c=0):\n    return a - b - c"),
                 "def test_sub_three():\n    assert sub(5, 3, 1) == 1\n", PYCACHE),
}


@dataclass(frozen=True)
class TaskSet:
    context: Path           # build context of the task image (Dockerfile + testbed/)
    instances: list[dict]
    agent_commands: dict[str, str]  # instance id -> the scripted agent's shell command


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env={**os.environ, **GIT_ENV})
    return done.stdout


def _fix(text: str, function: str, old: str, new: str) -> str:
    """`text` with the first `old` after `def function` replaced by `new`."""
    head, _, rest = text.partition(f"def {function}")
    return f"{head}def {function}{rest.replace(old, new, 1)}"


def _instance(repo: Path, base: str, instance_id: str) -> dict:
    problem, (function, old, new), test, _ = CASES[instance_id]
    (repo / "calc.py").write_text(_fix(CALC, function, old, new))
    patch = git(repo, "diff")
    tests = repo / "tests" / "test_calc.py"
    tests.write_text(TESTS.replace("from calc import neg, sub", f"from calc import {function}, neg, sub")
                     + "\n\n" + test)
    test_patch = git(repo, "diff", "--", "tests")
    git(repo, "checkout", "-q", "--", ".")
    test_id = "tests/test_calc.py::" + test.split("(")[0].removeprefix("def ")
    return {"instance_id": instance_id, "repo": "tracetap/calc", "base_commit": base, "patch": patch,
            "test_patch": test_patch, "problem_statement": problem, "version": "0.1",
            "FAIL_TO_PASS": json.dumps([test_id]),
            "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_neg", "tests/test_calc.py::test_sub"])}


def make_task_set(root: Path) -> TaskSet:
    context = root / "context"
    repo = context / "testbed"
    (repo / "tests").mkdir(parents=True)
    (context / "Dockerfile").write_text(DOCKERFILE)
    (repo / "calc.py").write_text(CALC)
    (repo / "tests" / "test_calc.py").write_text(TESTS)
    (repo / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "calc: four functions, two of them wrong")
    base = git(repo, "rev-parse", "HEAD").strip()
    instances = [_instance(repo, base, instance_id) for instance_id in CASES]
    (root / "instances.jsonl").write_text("".join(json.dumps(i) + "\n" for i in instances))
    return TaskSet(context, instances, {instance_id: case[3] for instance_id, case in CASES.items()})


if __name__ == "__main__":
    made = make_task_set(Path(sys.argv[1]))
    print(f"{made.context}\n{len(made.instances)} instances in {made.context.parent / 'instances.jsonl'}")
