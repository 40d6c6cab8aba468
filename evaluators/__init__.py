"""Evaluators score sessions into the store's `rewards` table.

The contract and registry live in `evaluators.base`; `evaluators.runner` scores a store.
"""

from tracetap.evaluators.base import EvalInput, EvalResult, Evaluator, EvaluatorError, create, resolve

__all__ = ["EvalInput", "EvalResult", "Evaluator", "EvaluatorError", "create", "resolve"]
