"""`test_on_output`: run the task's tests in the session's runtime (or workspace) and compare outcomes.

In a rollout the command runs in the session's live runtime (its default working directory, output kept
in `logs/eval/test_on_output.*.log`); offline, with no runtime, it runs on this host in the workspace.
Config: `test_command` (shell command), `expected` (map of pytest node id to
PASSED | FAILED | ERROR | SKIPPED | XFAIL | XPASS; a dict or a JSON string), `scoring` (`fraction`,
the default: share of expected outcomes met; or `all_or_nothing`), `timeout` (seconds, capped by the
session's time budget). The exit code is ignored: only the parsed per-test outcomes count, so a run
whose expected failures fail still scores 1. A run that exceeds its timeout is killed (its whole
process group) and scores 0 with `timed_out` in the details.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tracetap.evaluators.base import EvalInput, EvalResult, Evaluator, EvaluatorError, decoded_json, refuse_unknown_keys

STATUSES = ("PASSED", "SKIPPED", "XFAIL", "XPASS", "FAILED", "ERROR")  # later wins on conflicts
SCORINGS = ("fraction", "all_or_nothing")
OUTPUT_TAIL_CHARS = 8000
MAX_MISMATCHES = 50

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_XDIST = re.compile(r"^\[gw\d+\]\s+(?:\[\s*\d+%\]\s+)?")
_STATUS = "|".join(STATUSES)
# `path::name STATUS [ 50%]` (pytest -v) and `STATUS path::name - message` (summary lines)
_VERBOSE = re.compile(rf"^(?P<id>\S.*?::\S.*?)\s+(?P<status>{_STATUS})\b")
_SUMMARY = re.compile(rf"^(?P<status>{_STATUS})\s+(?P<id>\S.*?)(?: - .*)?$")


def _is_node_id(text: str) -> bool:
    return "::" in text or text.endswith(".py")


def parse_test_output(text: str) -> dict[str, str]:
    """Per-test outcomes from pytest-style output: {node id: status}; the worst status seen wins."""
    outcomes: dict[str, str] = {}
    for raw in _ANSI.sub("", text).splitlines():
        line = _XDIST.sub("", raw.strip())
        match = _SUMMARY.match(line) or _VERBOSE.match(line)
        if not match or not _is_node_id(match["id"].strip()):
            continue
        node, status = match["id"].strip(), match["status"]
        if STATUSES.index(status) >= STATUSES.index(outcomes.get(node, STATUSES[0])):
            outcomes[node] = status
    return outcomes


def _expected_map(value: object) -> dict[str, str]:
    value = decoded_json(value, "test_on_output: expected")
    if not isinstance(value, dict) or not value:
        raise EvaluatorError("test_on_output: expected must be a non-empty map {test_id: status}")
    expected = {}
    for node, status in value.items():
        if not isinstance(status, str) or status.upper() not in STATUSES:
            raise EvaluatorError(f"test_on_output: status of {node!r} must be one of {', '.join(STATUSES)}")
        expected[str(node)] = status.upper()
    return expected


def _timeout(value: Any) -> float | None:  # a config value: any JSON
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise EvaluatorError(f"test_on_output: timeout must be a number of seconds, got {value!r}") from None
    if not seconds > 0:
        raise EvaluatorError("test_on_output: timeout must be positive")
    return seconds


def run_command(command: str, cwd: Path, timeout: float) -> tuple[str, int | None, bool]:
    """Run `command` with sh in `cwd`: (stdout+stderr, exit code, timed out). Kills the group on timeout."""
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return out.decode(errors="replace"), proc.returncode, False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group ended on its own just now
            pass
        out, _ = proc.communicate()
        return out.decode(errors="replace"), None, True


def score(expected: dict[str, str], outcomes: dict[str, str], scoring: str) -> tuple[float, dict]:
    """The reward for parsed outcomes against the expected map, and the mismatches."""
    mismatches = {
        node: {"expected": want, "got": outcomes.get(node)}
        for node, want in expected.items()
        if outcomes.get(node) != want
    }
    met = len(expected) - len(mismatches)
    reward = met / len(expected) if scoring == "fraction" else float(not mismatches)
    shown = dict(list(mismatches.items())[:MAX_MISMATCHES])
    return reward, {"expected": len(expected), "met": met, "mismatches": shown}


class TestOnOutput(Evaluator):
    """Runs `test_command` in the workspace and scores parsed test outcomes against `expected`."""

    __test__ = False  # not a pytest test class, despite its name
    name = "test_on_output"

    def check_config(self, config: dict) -> dict:
        refuse_unknown_keys(config, {"test_command", "expected", "scoring", "timeout"}, "test_on_output")
        command = config.get("test_command")
        if not isinstance(command, str) or not command.strip():
            raise EvaluatorError("test_on_output: config test_command (a shell command) is required")
        scoring = config.get("scoring", "fraction")
        if scoring not in SCORINGS:
            raise EvaluatorError(f"test_on_output: scoring must be one of {', '.join(SCORINGS)}")
        return {"test_command": command, "expected": _expected_map(config.get("expected")),
                "scoring": scoring, "timeout": _timeout(config.get("timeout"))}

    def evaluate(self, inp: EvalInput) -> EvalResult:
        config = inp.config
        timeout = min(t for t in (config["timeout"], inp.timeout_seconds) if t is not None)
        started = time.monotonic()
        output, exit_code, timed_out = self._run(inp, timeout)
        details = {"exit_code": exit_code, "timed_out": timed_out, "timeout_s": timeout,
                   "duration_s": round(time.monotonic() - started, 3),
                   "output_tail": output[-OUTPUT_TAIL_CHARS:]}
        if timed_out:
            return EvalResult(reward=0.0, details={**details, "expected": len(config["expected"]), "met": 0})
        reward, comparison = score(config["expected"], parse_test_output(output), config["scoring"])
        return EvalResult(reward=reward, details={**details, **comparison})

    def _run(self, inp: EvalInput, timeout: float) -> tuple[str, int | None, bool]:
        """(stdout+stderr, exit code, timed out) of the test command, in the runtime when there is one."""
        command = inp.config["test_command"]
        if inp.runtime is not None:
            done = inp.runtime.exec(f"(\n{command}\n) 2>&1", timeout=timeout, log_name="eval/test_on_output")
            return done.stdout + done.stderr, None if done.timed_out else done.returncode, done.timed_out
        if inp.workspace is None or not inp.workspace.is_dir():
            raise EvaluatorError(f"test_on_output: no runtime and no workspace directory for session "
                                 f"{inp.session_id}")
        return run_command(command, inp.workspace, timeout)
