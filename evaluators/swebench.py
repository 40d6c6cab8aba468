"""`swebench`: grade a SWE-bench-format instance from the agent's `git diff`, in a fresh runtime.

Config: `instance` (a SWE-bench instance: `instance_id`, `repo`, `base_commit`, `test_patch`, `FAIL_TO_PASS`,
`PASS_TO_PASS`; the lists as lists or JSON strings), `repo_dir` (`/testbed`), `test_command` (SWE-bench's
pytest command), `exclude_patterns` (more globs to drop from the patch), `apply_timeout` (60 s) and
`test_timeout` (1200 s), both capped by the session's remaining time.

Flow: the agent's changes against `base_commit` are taken in its runtime (`git add -A`, `git diff --cached
--binary`, so new files count), minus build artefacts (`__pycache__`, `*.pyc`, `*.pyo`, `.pytest_cache` at
any depth). An empty patch scores 0 (`empty_generation`). Otherwise, in the fresh runtime (same image,
same prepare steps): apply it with SWE-bench's fallbacks (`git apply --verbose`, then with `--reject`,
then `patch --batch --fuzz=5 -p1 -i`; none works: 0 with `failed_apply_patch`), reset the test files to
`base_commit`, apply the test patch, run the test command on the test patch's files between SWE-bench's
markers, and grade its `-rA` summary by SWE-bench's rules (`resolved` when every FAIL_TO_PASS and every
PASS_TO_PASS test passes). `logs/eval/` keeps `patch.diff`, `test_output.txt` and `report.json`.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
import time
from pathlib import Path
from typing import Any

from tracetap.evaluators.base import (
    EvalInput,
    EvalResult,
    Evaluator,
    EvaluatorError,
    decoded_json,
    positive_seconds,
    refuse_unknown_keys,
)
from tracetap.evaluators.runtime import CommandResult, EvalRuntime, require

REQUIRED = ("instance_id", "repo", "base_commit", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")
TEST_COMMAND = "pytest --no-header -rA --tb=no -p no:cacheprovider"
APPLY_COMMANDS = ("git apply --verbose", "git apply --verbose --reject", "patch --batch --fuzz=5 -p1 -i")
EXCLUDES = ("__pycache__", "*.pyc", "*.pyo", ".pytest_cache")
START, END = ">>>>> Start Test Output", ">>>>> End Test Output"
STATUSES = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL")
PASSING = ("PASSED", "XFAIL")
APPLY_TAIL_CHARS, PATCH_HEAD_CHARS = 8000, 4000
DEFAULTS: dict[str, Any] = {"repo_dir": "/testbed", "test_command": TEST_COMMAND, "exclude_patterns": [],
                            "apply_timeout": 60.0, "test_timeout": 1200.0}


# -- the instance -----------------------------------------------------------------------------------------

def _test_list(instance: dict, key: str) -> list[str]:
    value = decoded_json(instance[key], f"swebench: {key}")
    if not isinstance(value, list) or not all(isinstance(test, str) for test in value):
        raise EvaluatorError(f"swebench: {key} must be a list of test ids")
    return value


def check_instance(value: object) -> dict[str, Any]:
    """The instance with its two test lists decoded; EvaluatorError naming what is missing or wrong."""
    value = decoded_json(value, "swebench: instance")
    if not isinstance(value, dict):
        raise EvaluatorError("swebench: config instance (a SWE-bench instance object) is required")
    missing = [key for key in REQUIRED if key not in value]
    if missing:
        raise EvaluatorError(f"swebench: the instance lacks {', '.join(missing)}")
    for key in ("instance_id", "repo", "base_commit", "test_patch"):
        if not isinstance(value[key], str) or not value[key].strip():
            raise EvaluatorError(f"swebench: instance {key} must be a non-empty string")
    return {**value, "FAIL_TO_PASS": _test_list(value, "FAIL_TO_PASS"),
            "PASS_TO_PASS": _test_list(value, "PASS_TO_PASS")}


# -- patches ----------------------------------------------------------------------------------------------

def split_sections(patch: str) -> list[str]:
    """A `git diff` cut into its per-file sections (each starting with `diff --git`)."""
    sections: list[str] = []
    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git ") or not sections:
            sections.append("")
        sections[-1] += line
    return sections


def section_path(section: str) -> str:
    """The path a diff section changes (its `b/` side; the `a/` side for a deletion)."""
    header = section.splitlines()[0] if section else ""
    _, _, b_side = header.partition(" b/")
    return b_side or header.removeprefix("diff --git a/")


def excluded(path: str, patterns: list[str]) -> bool:
    """A path any of whose components (or itself) matches a glob: `__pycache__` is excluded at any depth."""
    return any(fnmatch.fnmatch(part, pattern) for pattern in patterns for part in (path, *path.split("/")))


def drop_excluded(patch: str, patterns: list[str]) -> tuple[str, list[str]]:
    """(the patch without the sections of excluded paths, the paths dropped)."""
    kept, dropped = [], []
    for section in split_sections(patch):
        path = section_path(section)
        if section.startswith("diff --git ") and excluded(path, patterns):
            dropped.append(path)
        else:
            kept.append(section)
    return "".join(kept), dropped


def patch_files(patch: str) -> list[str]:
    """The files a patch touches, in order (the test files of a test patch)."""
    return [section_path(s) for s in split_sections(patch) if s.startswith("diff --git ")]


# -- grading (SWE-bench's rules) --------------------------------------------------------------------------

def parse_pytest_log(text: str) -> dict[str, str]:
    """SWE-bench's pytest parser: `STATUS test_id` lines of the `-rA` summary -> {test_id: STATUS}."""
    status_map: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith(STATUSES):
            continue
        if line.startswith("FAILED"):
            line = line.replace(" - ", " ")
        parts = line.split()
        if len(parts) > 1:
            status_map[parts[1]] = parts[0]
    return status_map


def marked_output(log: str) -> str | None:
    """The text between SWE-bench's start and end markers, or None when either is missing."""
    start, end = log.find(START), log.find(END)
    return log[start + len(START):end] if start != -1 and end > start else None


def grade_tests(status_map: dict[str, str], fail_to_pass: list[str], pass_to_pass: list[str]) -> dict:
    """Per-list success/failure: FAIL_TO_PASS passes on PASSED/XFAIL; PASS_TO_PASS also on SKIPPED."""
    report = {}
    for key, tests, ok in (("FAIL_TO_PASS", fail_to_pass, PASSING), ("PASS_TO_PASS", pass_to_pass,
                                                                     (*PASSING, "SKIPPED"))):
        report[key] = {"success": [t for t in tests if status_map.get(t) in ok],
                       "failure": [t for t in tests if status_map.get(t) not in ok]}
    return report


def _rate(lists: dict) -> float:
    total = len(lists["success"]) + len(lists["failure"])
    return 1.0 if total == 0 else len(lists["success"]) / total


def resolution(report: dict) -> str:
    """RESOLVED_FULL when both pass rates are 1 (an empty list counts as 1), PARTIAL, else NO."""
    f2p, p2p = _rate(report["FAIL_TO_PASS"]), _rate(report["PASS_TO_PASS"])
    if f2p == 1 and p2p == 1:
        return "RESOLVED_FULL"
    return "RESOLVED_PARTIAL" if 0 < f2p < 1 and p2p == 1 else "RESOLVED_NO"


# -- the evaluator ----------------------------------------------------------------------------------------

class _Clock:
    """The session's remaining evaluation time; each step's timeout is capped by it."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def cap(self, seconds: float) -> float:
        return max(1.0, min(seconds, self.deadline - time.monotonic()))


class SweBench(Evaluator):
    """Takes the agent's patch, applies it with the test patch in a fresh runtime, grades SWE-bench's way."""

    name = "swebench"
    needs_fresh_runtime = True

    def check_config(self, config: dict) -> dict:
        refuse_unknown_keys(config, {"instance", *DEFAULTS}, "swebench")
        merged = {**DEFAULTS, **config, "instance": check_instance(config.get("instance"))}
        for key in ("repo_dir", "test_command"):
            if not isinstance(merged[key], str) or not merged[key].strip():
                raise EvaluatorError(f"swebench: {key} must be a non-empty string")
        if not isinstance(merged["exclude_patterns"], list) or not all(
                isinstance(p, str) for p in merged["exclude_patterns"]):
            raise EvaluatorError("swebench: exclude_patterns must be a list of globs")
        return {**merged, **{key: positive_seconds(merged[key], f"swebench: {key}")
                             for key in ("apply_timeout", "test_timeout")}}

    def evaluate(self, inp: EvalInput) -> EvalResult:
        agent = require(inp.runtime, self.name)
        fresh = require(inp.fresh_runtime, self.name, "a fresh runtime (set by a rollout node)")
        config, clock = inp.config, _Clock(inp.timeout_seconds)
        instance = config["instance"]
        patch, dropped = self._agent_patch(agent, config, clock)
        _keep(inp.logs_dir, "patch.diff", patch)
        report = {"patch_is_None": False, "patch_exists": bool(patch.strip()), "patch_successfully_applied": False,
                  "resolved": False, "excluded_paths": dropped}
        if not patch.strip():
            report.update(empty_generation=True, reason="the agent's patch is empty")
        else:
            report.update(self._grade(fresh, patch, config, clock, inp.logs_dir))
        _keep(inp.logs_dir, "report.json", json.dumps({instance["instance_id"]: report}, indent=2))
        return EvalResult(reward=1.0 if report["resolved"] else 0.0,
                          details={"instance_id": instance["instance_id"], **report})

    def _agent_patch(self, agent: EvalRuntime, config: dict, clock: _Clock) -> tuple[str, list[str]]:
        base = shlex.quote(config["instance"]["base_commit"])
        done = agent.exec(f"git add -A && git diff --cached --binary --submodule=diff {base}",
                          timeout=clock.cap(config["apply_timeout"]), log_name="eval/agent_patch",
                          cwd=config["repo_dir"])
        if done.returncode != 0:
            raise EvaluatorError(f"swebench: git diff in the agent's runtime exited with {done.returncode}: "
                                 f"{done.stderr.strip()[-500:]}")
        return drop_excluded(done.stdout, [*EXCLUDES, *config["exclude_patterns"]])

    def _grade(self, fresh: EvalRuntime, patch: str, config: dict, clock: _Clock, logs_dir: Path | None) -> dict:
        applied, output = self._apply(fresh, patch, config, clock)
        if applied is None:
            return {"failed_apply_patch": True, "reason": "the patch applies with none of SWE-bench's methods",
                    "apply_output_tail": output[-APPLY_TAIL_CHARS:], "patch_head": patch[:PATCH_HEAD_CHARS]}
        self._apply_test_patch(fresh, config, clock)
        run = self._run_tests(fresh, config, clock)
        _keep(logs_dir, "test_output.txt", run.stdout)
        instance = config["instance"]
        verdict: dict[str, Any] = {"patch_successfully_applied": True, "apply_command": applied}
        section = marked_output(run.stdout)
        if run.timed_out or section is None:
            why = "the tests ran out of time" if run.timed_out else "the test output lacks SWE-bench's markers"
            return {**verdict, "test_timeout": run.timed_out, "reason": why}
        tests = grade_tests(parse_pytest_log(section), instance["FAIL_TO_PASS"], instance["PASS_TO_PASS"])
        status = resolution(tests)
        return {**verdict, "resolved": status == "RESOLVED_FULL", "resolution": status, "tests_status": tests}

    def _apply(self, fresh: EvalRuntime, patch: str, config: dict, clock: _Clock) -> tuple[str | None, str]:
        """(the command that applied the patch or None, what the attempts printed)."""
        target = f"{fresh.scratch}/model.patch"
        fresh.write_text(target, patch)
        outputs = []
        for number, command in enumerate(APPLY_COMMANDS):
            done = fresh.exec(f"{command} {shlex.quote(target)}", timeout=clock.cap(config["apply_timeout"]),
                              log_name=f"eval/apply.{number}", cwd=config["repo_dir"])
            outputs.append(f"$ {command}\n{done.stdout}{done.stderr}")
            if done.returncode == 0:
                return command, "".join(outputs)
        return None, "".join(outputs)

    def _apply_test_patch(self, fresh: EvalRuntime, config: dict, clock: _Clock) -> None:
        """Test files back to `base_commit` (or gone, if it lacks them), then the test patch applied."""
        instance, target = config["instance"], f"{fresh.scratch}/test.patch"
        fresh.write_text(target, instance["test_patch"])
        base = shlex.quote(instance["base_commit"])
        reset = " ".join(f"{{ git cat-file -e {base}:{shlex.quote(f)} 2>/dev/null && git checkout -q {base} -- "
                         f"{shlex.quote(f)} || rm -f {shlex.quote(f)}; }};"
                         for f in patch_files(instance["test_patch"]))
        done = fresh.exec(f"{reset} git apply --verbose {shlex.quote(target)}", log_name="eval/test_patch",
                          timeout=clock.cap(config["apply_timeout"]), cwd=config["repo_dir"])
        if done.returncode != 0:
            raise EvaluatorError(f"swebench: the test patch of {instance['instance_id']} does not apply: "
                                 f"{done.stderr.strip()[-500:]}")

    def _run_tests(self, fresh: EvalRuntime, config: dict, clock: _Clock) -> CommandResult:
        files = " ".join(shlex.quote(f) for f in patch_files(config["instance"]["test_patch"]))
        command = f"echo {shlex.quote(START)}\n{config['test_command']} {files}\necho {shlex.quote(END)}"
        return fresh.exec(f"(\n{command}\n) 2>&1", timeout=clock.cap(config["test_timeout"]), log_name="eval/tests",
                          cwd=config["repo_dir"])


def _keep(logs_dir: Path | None, name: str, text: str) -> None:
    if logs_dir is not None:
        (logs_dir / name).write_text(text)
