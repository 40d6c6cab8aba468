"""The reference system's task shapes (reference-system.md §5.1/5.2), so bridges written for it work unchanged.

Its TaskRequest uses our field names; it differs in two spellings, translated here: an evaluator given
as a bare name, and `agent.custom_shell` (a command for harness `shell`, which we carry as
`agent.settings.command`). Its TaskResult is `{task_id, status: running|completed|failed, results,
result_paths}`: a cancelled task is `failed` there, and `result_paths` points at the persisted record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracetap.rollout.models import TaskRequest, TaskResult


def from_reference(body: Any) -> TaskRequest:
    """Validate a reference-shaped TaskRequest body (pydantic's ValidationError names the field)."""
    if not isinstance(body, dict):
        return TaskRequest.model_validate(body)
    body = dict(body)
    if isinstance(body.get("evaluator"), str):
        body["evaluator"] = {"name": body["evaluator"]}
    agent = body.get("agent")
    if isinstance(agent, dict) and "custom_shell" in agent:
        agent = dict(agent)
        settings = {**(agent.get("settings") or {}), "command": agent.pop("custom_shell")}
        body["agent"] = {**agent, "settings": settings}
    return TaskRequest.model_validate(body)


def to_reference(result: TaskResult, store: Path) -> dict:
    status = "failed" if result.status == "cancelled" else result.status
    return {"task_id": result.task_id, "status": status,
            "results": [r.model_dump(mode="json") for r in result.results],
            "result_paths": [str(store / "rollouts")]}  # the Delta table holding the task's row
