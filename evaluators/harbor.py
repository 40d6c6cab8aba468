"""`harbor`: a Harbor task's verifier, run in the session's live runtime after the agent finished.

Config: `tests_dir` (host folder holding `test.sh`; required), `timeout` (seconds, default 600, capped by
the session's budget), `env` (the verifier's env), `cwd` (its working directory; default the runtime's).
Flow, as current Harbor does it: copy `tests_dir` to `/tests`, make `/logs/verifier`, run `/tests/test.sh`
(its exit code is ignored), then read the reward: `/logs/verifier/reward.json` first (a flat
`{name: number}` object, `reward` its primary key), else `reward.txt` (one number). An empty or
unparseable file, no file at all, or a verifier out of time is an error, not a zero. The reference
system reads `reward.txt` first, averages a dict and scores those failures 0.0. The verifier's stdout
and stderr are kept in the session's `logs/eval/verifier.*.log`, the reward files in `logs/eval/`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracetap.evaluators.base import (
    EvalInput,
    EvalResult,
    Evaluator,
    EvaluatorError,
    check_reward,
    positive_seconds,
    refuse_unknown_keys,
)
from tracetap.evaluators.runtime import EvalRuntime, require

TESTS = "/tests"
VERIFIER_LOGS = "/logs/verifier"
REWARD_FILES = ("reward.json", "reward.txt")  # current Harbor: JSON first
DEFAULT_TIMEOUT = 600.0
OUTPUT_TAIL_CHARS = 4000


def check_tests_dir(value: object) -> Path:
    """The tests folder as an absolute path; it must hold `test.sh` (the verifier)."""
    if not isinstance(value, str | Path) or not str(value).strip():
        raise EvaluatorError("harbor: config tests_dir (the task's tests folder) is required")
    folder = Path(value).expanduser().resolve()
    if not (folder / "test.sh").is_file():
        raise EvaluatorError(f"harbor: {folder} has no test.sh (a Harbor task's verifier is tests/test.sh)")
    return folder


def _env(value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise EvaluatorError("harbor: env must be a map of names to values")
    return {name: str(text) for name, text in value.items()}


def parse_reward(name: str, text: str) -> dict[str, float]:
    """Harbor's reading of a reward file: JSON a flat {name: number} object, text one number."""
    if not text.strip():
        raise EvaluatorError(f"harbor: {VERIFIER_LOGS}/{name} is empty")
    try:
        rewards = json.loads(text) if name.endswith(".json") else {"reward": float(text.strip())}
    except ValueError as error:
        raise EvaluatorError(f"harbor: cannot parse {VERIFIER_LOGS}/{name}: {error}") from None
    if not isinstance(rewards, dict) or not rewards:
        raise EvaluatorError(f"harbor: {VERIFIER_LOGS}/{name} must be a flat object of numbers")
    return {key: check_reward(value, f"harbor: {name} {key!r}") for key, value in rewards.items()}


def primary(rewards: dict[str, float]) -> float:
    """The `reward` entry, or the only entry; several without `reward` is ambiguous."""
    if "reward" in rewards:
        return rewards["reward"]
    if len(rewards) == 1:
        return next(iter(rewards.values()))
    raise EvaluatorError(f"harbor: several rewards and none named 'reward': {', '.join(rewards)}")


class Harbor(Evaluator):
    """Uploads a Harbor task's tests, runs its verifier in the session's runtime, reads its reward file."""

    name = "harbor"

    def check_config(self, config: dict) -> dict:
        refuse_unknown_keys(config, {"tests_dir", "timeout", "env", "cwd"}, "harbor")
        cwd = config.get("cwd")
        if cwd is not None and not (isinstance(cwd, str) and cwd.startswith("/")):
            raise EvaluatorError("harbor: cwd must be an absolute path inside the runtime")
        return {"tests_dir": str(check_tests_dir(config.get("tests_dir"))),
                "timeout": positive_seconds(config.get("timeout", DEFAULT_TIMEOUT), "harbor: timeout"),
                "env": _env(config.get("env", {})), "cwd": cwd}

    def evaluate(self, inp: EvalInput) -> EvalResult:
        runtime, config = require(inp.runtime, self.name), inp.config
        tests = check_tests_dir(config["tests_dir"])  # it may have gone since the task was accepted
        timeout = min(config["timeout"], inp.timeout_seconds)
        self._stage(runtime, tests)
        done = runtime.exec(f"chmod +x {TESTS}/test.sh && {TESTS}/test.sh", timeout=timeout,
                            log_name="eval/verifier", env=config["env"], cwd=config["cwd"])
        if done.timed_out:
            raise EvaluatorError(f"harbor: the verifier ran out of its {timeout:g} s")
        name, rewards = self._rewards(runtime, inp.logs_dir)
        return EvalResult(reward=primary(rewards), details={
            "rewards": rewards, "reward_file": name, "verifier_exit_code": done.returncode,
            "verifier_output_tail": (done.stdout + done.stderr)[-OUTPUT_TAIL_CHARS:]})

    def _stage(self, runtime: EvalRuntime, tests: Path) -> None:
        """A clean `/tests` with the task's tests and an empty `/logs/verifier`."""
        made = runtime.exec(f"rm -rf {TESTS} {VERIFIER_LOGS} && mkdir -p {VERIFIER_LOGS} && chmod 777 {VERIFIER_LOGS}",
                            timeout=60, log_name="eval/stage")
        if made.returncode != 0:
            raise EvaluatorError(f"harbor: cannot prepare {TESTS} and {VERIFIER_LOGS}: {made.stderr.strip()}")
        runtime.upload(tests, TESTS)

    def _rewards(self, runtime: EvalRuntime, logs_dir: Path | None) -> tuple[str, dict[str, Any]]:
        for name in REWARD_FILES:
            try:
                text = runtime.read_text(f"{VERIFIER_LOGS}/{name}")
            except FileNotFoundError:
                continue
            if logs_dir is not None:
                (logs_dir / name).write_text(text)
            return name, parse_reward(name, text)
        raise EvaluatorError(f"harbor: the verifier wrote no {' or '.join(REWARD_FILES)} in {VERIFIER_LOGS}")
