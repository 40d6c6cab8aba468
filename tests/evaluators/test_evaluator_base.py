"""The evaluator registry (built-in names and module:Class) and the result contract."""

from __future__ import annotations

import math
import textwrap

import pytest
from tracetap.evaluators.base import EvalResult, Evaluator, EvaluatorError, create, evaluator_name, resolve
from tracetap.evaluators.session_completed import SessionCompleted
from tracetap.evaluators.test_on_output import TestOnOutput


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A real module on sys.path with evaluator classes, good and bad."""
    (tmp_path / "my_evals.py").write_text(textwrap.dedent('''
        from tracetap.evaluators.base import EvalResult, Evaluator

        class Halves(Evaluator):
            name = "halves"
            def evaluate(self, inp):
                return EvalResult(trace_rewards=[0.5] * len(inp.trajectory))

        class Unnamed(Evaluator):
            def evaluate(self, inp):
                return EvalResult(reward=1)

        class BadName(Evaluator):
            name = "../escape"

        class NotAnEvaluator:
            pass
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_evals"


@pytest.mark.parametrize("spec, cls", [("session_completed", SessionCompleted),
                                       ("test_on_output", TestOnOutput)])
def test_builtins_resolve_by_name(spec, cls):
    assert resolve(spec) is cls
    assert evaluator_name(cls) == spec
    assert isinstance(create(spec), cls)


def test_module_class_resolves_and_names_itself(plugin):
    halves = resolve(f"{plugin}:Halves")
    assert issubclass(halves, Evaluator) and evaluator_name(halves) == "halves"
    assert evaluator_name(resolve(f"{plugin}:Unnamed")) == "Unnamed"


@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown evaluator 'nope'; built-ins: session_completed, test_on_output"),
    ("no_such_module_xyz:Thing", "cannot import 'no_such_module_xyz'"),
    ("tracetap.evaluators.base:Missing", "has no 'Missing'"),
    ("tracetap.evaluators.base:EvalResult", "not a subclass"),
    (":Thing", "expected module:Class"),
    ("my_evals:NotAnEvaluator", "not a subclass"),
    ("my_evals:BadName", "invalid evaluator name"),
])
def test_bad_specs_give_clear_errors(plugin, spec, message):
    with pytest.raises(EvaluatorError, match=message.replace("(", r"\(")):
        resolve(spec)


@pytest.mark.parametrize("kwargs", [
    {"reward": True},
    {"reward": math.nan},
    {"reward": math.inf},
    {"reward": "1.0"},
    {"trace_rewards": [1.0, False]},
    {"trace_rewards": [0.5, -math.inf]},
    {"details": ["not", "a", "dict"]},
    {"details": {"x": object()}},
    {"details": {"x": math.nan}},
])
def test_results_reject_non_finite_bool_and_unserializable(kwargs):
    with pytest.raises(EvaluatorError):
        EvalResult(**kwargs)


def test_results_normalize_numbers_to_float():
    result = EvalResult(reward=1, trace_rewards=[0, 1], details={"n": 2})
    assert result.reward == 1.0 and isinstance(result.reward, float)
    assert result.trace_rewards == [0.0, 1.0] and all(isinstance(r, float) for r in result.trace_rewards)
