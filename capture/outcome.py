"""`POST /sessions/{id}/complete`: an agent (or the environment around it) posts the outcome it scored.

The body `{reward, trace_rewards?, status?, details?}` is checked here (pure) and becomes one `rewards` row
under the evaluator name `posted`, joined to the session's traces like any evaluator's. Posting the same
outcome again changes nothing; a different one for a session that already has one is a conflict.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from tracetap.capture.redact import Redactor
from tracetap.capture.registration import MAX_LABEL, FieldError, json_object, object_field

EVALUATOR = "posted"
FIELDS = ("reward", "trace_rewards", "status", "details")
MAX_TRACE_REWARDS = 65536


@dataclass(frozen=True)
class Outcome:
    reward: float
    trace_rewards: list[float] | None = None
    status: str | None = None  # the agent's own word for how it ended (e.g. completed, failed)
    details: dict = field(default_factory=dict)


def parse_outcome(body: bytes) -> Outcome:
    """The checked outcome, or FieldError naming the field at fault."""
    data = json_object(body, FIELDS)
    return Outcome(_number(data.get("reward"), "reward"), _trace_rewards(data.get("trace_rewards")),
                   _status(data.get("status")), object_field(data, "details"))


def reward_row(outcome: Outcome, redactor: Redactor) -> dict:
    """The `rewards` row (without session_id), details redacted like everything stored."""
    details = {"status": outcome.status, "details": redactor.redact(outcome.details)}
    return {"evaluator": EVALUATOR, "reward": outcome.reward, "trace_rewards": outcome.trace_rewards,
            "details_json": json.dumps(details, sort_keys=True), "created_at": datetime.now(UTC)}


def same_outcome(stored: dict, row: dict) -> bool:
    """Whether a stored `posted` row says what `row` says (its time aside)."""
    return all(stored[key] == row[key] for key in ("reward", "trace_rewards", "details_json"))


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise FieldError(422, f"{where}: must be a finite number")
    return float(value)


def _trace_rewards(value: object) -> list[float] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_TRACE_REWARDS:
        raise FieldError(422, f"trace_rewards: must be a list of at most {MAX_TRACE_REWARDS} numbers")
    return [_number(item, f"trace_rewards.{index}") for index, item in enumerate(value)]


def _status(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_LABEL or not value.isprintable():
        raise FieldError(422, f"status: must be printable text of at most {MAX_LABEL} characters")
    return value.strip()
