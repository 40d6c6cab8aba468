"""Task requests and their results, kept in the store (`rollouts/task_id=<id>/task.json`).

Written atomically after every session that ends and once more when the task ends, always before the
callback: a trainer whose receiver was down, or a server that restarted, can still poll the result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tracetap.rollout.models import TaskRequest, TaskResult
from tracetap.store import read_tasks, task_file, write_text_atomic


@dataclass
class TaskRecord:
    request: TaskRequest
    result: TaskResult


class ResultStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def save(self, record: TaskRecord) -> None:
        path = task_file(self.root, record.request.task_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"request": record.request.model_dump(mode="json"), "result": record.result.model_dump(mode="json")}
        write_text_atomic(path, json.dumps(body, indent=1))

    def load_all(self) -> dict[str, TaskRecord]:
        """Every task this store has seen, by task id (a restarted server answers for them)."""
        records = {}
        for body in read_tasks(self.root).values():
            record = TaskRecord(TaskRequest.model_validate(body["request"]),
                                TaskResult.model_validate(body["result"]))
            records[record.request.task_id] = record
        return records
