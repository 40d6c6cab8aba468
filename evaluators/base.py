"""The evaluator contract and registry: what an evaluator gets, what it returns, how it is named.

An evaluator scores one session. It gets an `EvalInput` (ids, its workspace, its trajectory and
completion rows, a time budget, its config) and returns an `EvalResult`: an outcome reward broadcast
to every trace, and/or one reward per trace, plus JSON details. Built-ins are looked up by name;
anything else is given as `module:Class` and must subclass `Evaluator`.
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tracetap.store import validate_name

if TYPE_CHECKING:
    from tracetap.evaluators.runtime import EvalRuntime

BUILTINS = {
    "session_completed": "tracetap.evaluators.session_completed:SessionCompleted",
    "test_on_output": "tracetap.evaluators.test_on_output:TestOnOutput",
    "harbor": "tracetap.evaluators.harbor:Harbor",
    "swebench": "tracetap.evaluators.swebench:SweBench",
}


class EvaluatorError(ValueError):
    """An evaluator name, class or config that cannot be used."""


@dataclass(frozen=True)
class EvalInput:
    """One session, as an evaluator sees it.

    `trajectory` holds the session's trajectory rows of one builder (by trace_index, possibly empty);
    `completions` its completion rows in seq order (token arrays and JSON bodies included). In a rollout,
    `runtime` is the session's live runtime, `fresh_runtime` a second one from the same image (only for an
    evaluator that sets `needs_fresh_runtime`), and `logs_dir` the host folder for its own logs
    (the session's `logs/eval`); all three are None offline.
    """

    session_id: str
    task_id: str | None
    workspace: Path | None
    trajectory: list[dict]
    completions: list[dict]
    timeout_seconds: float
    config: dict[str, Any]
    session: dict = field(default_factory=dict)
    runtime: EvalRuntime | None = None
    fresh_runtime: EvalRuntime | None = None
    logs_dir: Path | None = None


def check_reward(value: object, what: str = "reward") -> float:
    """A finite real number as float; bools and NaN/inf are rejected (they are bugs, not scores)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise EvaluatorError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def positive_seconds(value: object, what: str) -> float:
    """A config timeout: a positive number of seconds, as float."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise EvaluatorError(f"{what} must be a positive number of seconds, got {value!r}")
    return float(value)


def refuse_unknown_keys(config: dict[str, Any], known: set[str], evaluator: str) -> None:
    """EvaluatorError naming config keys the evaluator does not take (a typo must not pass silently)."""
    unknown = set(config) - known
    if unknown:
        raise EvaluatorError(f"{evaluator}: unknown config key(s): {', '.join(sorted(unknown))}")


def decoded_json(value: object, what: str) -> object:
    """A config value given as JSON text (`--config k=JSON` on the command line) decoded; others as they are."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise EvaluatorError(f"{what} is not valid JSON: {error}") from None


@dataclass(frozen=True)
class EvalResult:
    """An evaluator's verdict. `reward` is broadcast to every trace; `trace_rewards` (one per trace) wins."""

    reward: float | None = None
    trace_rewards: list[float] | None = None
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reward is not None:
            object.__setattr__(self, "reward", check_reward(self.reward))
        if self.trace_rewards is not None:
            checked = [check_reward(r, f"trace_rewards[{i}]") for i, r in enumerate(self.trace_rewards)]
            object.__setattr__(self, "trace_rewards", checked)
        if not isinstance(self.details, dict):
            raise EvaluatorError(f"details must be a dict, got {type(self.details).__name__}")
        try:  # details are stored as JSON: fail here, not at write time
            json.dumps(self.details, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise EvaluatorError(f"details must be JSON-serializable: {error}") from None


class Evaluator:
    """Base class. Subclasses set `name` and implement `evaluate`; `check_config` validates early.

    `needs_fresh_runtime`: a rollout node starts a second runtime from the session's image when RUN starts
    (ready by POSTRUN, off the critical path) and hands it over as `EvalInput.fresh_runtime`.
    """

    name: ClassVar[str] = ""
    needs_fresh_runtime: ClassVar[bool] = False

    def check_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config with defaults filled in, or EvaluatorError. Runs once, before any session."""
        return dict(config)

    def evaluate(self, inp: EvalInput) -> EvalResult:
        raise NotImplementedError


def evaluator_name(cls: type[Evaluator]) -> str:
    """The name results are stored under (the `evaluator` column of `rewards`)."""
    try:
        return validate_name(cls.name or cls.__name__, "evaluator name")
    except ValueError as error:
        raise EvaluatorError(str(error)) from None


def _import_class(spec: str) -> type:
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise EvaluatorError(f"evaluator {spec!r}: expected module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise EvaluatorError(f"evaluator {spec!r}: cannot import {module_name!r}: {error}") from error
    try:
        return getattr(module, class_name)
    except AttributeError:
        raise EvaluatorError(f"evaluator {spec!r}: {module_name} has no {class_name!r}") from None


def resolve(spec: str) -> type[Evaluator]:
    """The evaluator class for a built-in name or a `module:Class` spec."""
    if spec in BUILTINS:
        cls = _import_class(BUILTINS[spec])
    elif ":" in spec:
        cls = _import_class(spec)
    else:
        raise EvaluatorError(f"unknown evaluator {spec!r}; built-ins: {', '.join(BUILTINS)}, or module:Class")
    if not (isinstance(cls, type) and issubclass(cls, Evaluator)):
        raise EvaluatorError(f"evaluator {spec!r} is not a subclass of evaluators.base.Evaluator")
    evaluator_name(cls)
    return cls


def create(spec: str) -> Evaluator:
    """A fresh instance of the evaluator named by `spec`."""
    return resolve(spec)()
