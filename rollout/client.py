"""A small HTTP client of the rollout server, for the CLI (and anyone scripting it)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import httpx
from tracetap.rollout.models import TaskRequest, TaskResult

from tracetap.control import control_token

DEFAULT_SERVER = "http://127.0.0.1:8790"
POLL_SECONDS = 0.5


class RolloutError(RuntimeError):
    """The server refused the request or could not be reached; the message says why."""


class RolloutClient:
    def __init__(self, url: str = DEFAULT_SERVER, timeout: float = 30.0) -> None:
        headers = {"authorization": f"Bearer {control_token()}"}  # submitting and cancelling need it
        self.http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout, trust_env=False, headers=headers)

    def _call(self, method: str, path: str, **kwargs) -> dict:
        try:
            reply = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise RolloutError(f"the rollout server at {self.http.base_url} is unreachable: {exc}") from None
        if not reply.is_success:
            raise RolloutError(f"{reply.status_code}: {_detail(reply)}")
        return reply.json()

    def submit(self, task: TaskRequest) -> TaskResult:
        return TaskResult.model_validate(self._call("POST", "/tasks", json=task.model_dump(mode="json")))

    def task(self, task_id: str) -> TaskResult:
        return TaskResult.model_validate(self._call("GET", f"/tasks/{task_id}"))

    def cancel(self, task_id: str) -> TaskResult:
        return TaskResult.model_validate(self._call("DELETE", f"/tasks/{task_id}"))

    def status(self) -> dict:
        return self._call("GET", "/status")

    def stages(self, result: TaskResult) -> Counter[str]:
        """How many of the task's sessions are in each status right now."""
        return Counter(self._call("GET", f"/sessions/{sid}")["status"] for sid in result.session_ids)

    def wait(self, task_id: str, on_progress: Callable[[Counter[str]], None] | None = None) -> TaskResult:
        result = self.task(task_id)
        while result.status == "running":
            if on_progress:
                on_progress(self.stages(result))
            time.sleep(POLL_SECONDS)
            result = self.task(task_id)
        return result

    def close(self) -> None:
        self.http.close()


def _detail(reply: httpx.Response) -> str:
    try:
        detail = reply.json().get("detail", reply.text)
    except ValueError:
        return reply.text
    if isinstance(detail, list):  # FastAPI's validation errors
        return "; ".join(f"{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}" for e in detail)
    return str(detail)
