"""TaskRequest files for `tracetap rollout submit`: YAML or JSON (JSON is YAML), errors naming the field."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError
from tracetap.rollout.models import TaskRequest


class TaskFileError(ValueError):
    pass


def describe(exc: ValidationError) -> str:
    """One line per problem: `field.path: message`."""
    return "\n".join(f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}" for e in exc.errors())


def load_task(path: Path) -> TaskRequest:
    try:
        body = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise TaskFileError(f"{path} is not valid YAML or JSON: {exc}") from None
    if not isinstance(body, dict):
        raise TaskFileError(f"{path}: a task file holds one mapping (task_id, instruction, agent, ...)")
    try:
        return TaskRequest.model_validate(body)
    except ValidationError as exc:
        raise TaskFileError(f"{path}: invalid task\n{describe(exc)}") from None
