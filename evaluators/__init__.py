"""Evaluators score sessions into the store's `rewards` table.

The contract and registry live in `evaluators.base`, the runtime handle a rollout gives evaluators in
`evaluators.runtime`; `evaluators.runner` scores a store.
"""

from tracetap.evaluators.base import EvalInput, EvalResult, Evaluator, EvaluatorError, create, resolve
from tracetap.evaluators.runtime import CommandResult, EvalRuntime

__all__ = ["CommandResult", "EvalInput", "EvalResult", "EvalRuntime", "Evaluator", "EvaluatorError", "create",
           "resolve"]
