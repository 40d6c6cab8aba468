"""`POST /sessions`: a rollout node (or `tracetap run`) names a session before its harness runs.

Harness CLIs cannot add headers, so the task id and harness of a rollout session reach the store
this way: the body `{session_id, task_id, harness, metadata, session_key?, outcome_token?}` is checked
here (pure). The two secrets (capture/capabilities.py) may come from the registrant, so a retried
registration is the same registration; the gateway issues any it was not given.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from tracetap.capture.capabilities import OUTCOME_TOKEN_PREFIX, SESSION_KEY_PREFIX, issued_shape
from tracetap.store import InvalidSessionId, validate_session_id

FIELDS = ("session_id", "task_id", "harness", "metadata", "session_key", "outcome_token")
MAX_LABEL = 256


class FieldError(ValueError):
    """A body of a session endpoint the gateway refuses; `status` is 400 (not a JSON object) or 422 (a bad
    field, named first in the message)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Registration:
    session_id: str
    task_id: str | None = None
    harness: str | None = None
    metadata: dict = field(default_factory=dict)
    session_key: str | None = None
    outcome_token: str | None = None


def parse_registration(body: bytes) -> Registration:
    """The checked registration, or FieldError naming the field at fault."""
    data = json_object(body, FIELDS)
    return Registration(_session_id(data.get("session_id")), _label(data, "task_id"), _label(data, "harness"),
                        object_field(data, "metadata"), _secret(data, "session_key", SESSION_KEY_PREFIX),
                        _secret(data, "outcome_token", OUTCOME_TOKEN_PREFIX))


def _secret(data: dict, name: str, prefix: str) -> str | None:
    value = data.get(name)
    if value is not None and not (isinstance(value, str) and issued_shape(value, prefix)):
        raise FieldError(422, f"{name}: must be {prefix} followed by 32 to 200 URL-safe characters")
    return value


def json_object(body: bytes, known: Sequence[str]) -> dict:
    """The body as a JSON object holding only `known` fields; FieldError (400 or 422) otherwise."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FieldError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise FieldError(400, "request body must be a JSON object")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise FieldError(422, f"unknown field(s): {', '.join(unknown)}; known: {', '.join(known)}")
    return data


def object_field(data: dict, name: str) -> dict:
    """An optional field that must be a JSON object ({} when absent or null)."""
    value = data.get(name) or {}
    if not isinstance(value, dict):
        raise FieldError(422, f"{name}: must be a JSON object")
    return value


def _session_id(value: object) -> str:
    if not isinstance(value, str):
        raise FieldError(422, "session_id is required and must be a string")
    try:
        return validate_session_id(value)
    except InvalidSessionId as exc:
        raise FieldError(422, f"session_id: {exc}") from None


def _label(data: dict, name: str) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_LABEL:
        raise FieldError(422, f"{name} must be a non-empty string of at most {MAX_LABEL} characters")
    return value.strip()
