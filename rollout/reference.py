"""The reference system's wire shapes (reference-system.md §5.1), so bridges written for it work unchanged.

Its TaskRequest has the same core fields as ours plus a few we do not act on (MCP servers, skills, GPU
counts, an evaluator env); those are dropped, never guessed at. Its SessionResult carries
`trajectory` and timing named `register_to_init_queue_ms`; its TaskResult adds `result_paths`.
"""

from __future__ import annotations

from typing import Any

from tracetap.rollout.models import SessionResult, TaskRequest, TaskResult

_DROPPED = {
    "runtime": ("eval_prepare", "gpus", "storage_mb", "import_path", "kwargs"),
    "agent": ("mcp_servers", "skills_path"),
    "evaluator": ("env",),
}


def to_task_request(body: dict[str, Any]) -> TaskRequest:
    """Its submit body as our TaskRequest (pydantic's ValidationError on a bad one)."""
    body = dict(body)
    for part, fields in _DROPPED.items():
        if isinstance(body.get(part), dict):
            body[part] = {k: v for k, v in body[part].items() if k not in fields}
    agent = body.get("agent")
    if isinstance(agent, dict) and agent.get("custom_shell"):
        shell = agent.pop("custom_shell")
        agent["settings"] = {**agent.get("settings", {}), "command": shell}
    if isinstance(body.get("evaluator"), str):
        body["evaluator"] = {"name": body["evaluator"]}
    return TaskRequest.model_validate(body)


def session_result(result: SessionResult) -> dict[str, Any]:
    timing = result.timing
    return {
        "session_id": result.session_id, "task_id": result.task_id, "status": result.status.value,
        "trajectory": {"traces": result.traces, "reward": result.reward,
                       "prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens},
        "timing": {"register_to_init_queue_ms": timing.queued_ms, "init_ms": timing.init_ms,
                   "run_ms": timing.run_ms, "postrun_ms": timing.postrun_ms},
        "node_id": result.node_id, "error": result.error, "metadata": {"logs": result.logs},
    }


def task_result(result: TaskResult, result_path: str) -> dict[str, Any]:
    status = "completed" if result.status == "cancelled" else result.status  # it knows no cancelled
    return {"task_id": result.task_id, "status": status,
            "results": [session_result(r) for r in result.results], "result_paths": [result_path]}
