"""Task requests and their results, kept in the store's `rollouts` table (store/tasks.py).

Written after every session that ends and once more when the task ends, always before the
callback: a trainer whose receiver was down, or a server that restarted, can still poll the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tracetap.rollout.models import TaskRequest, TaskResult
from tracetap.store import read_tasks, save_task


@dataclass
class TaskRecord:
    request: TaskRequest
    result: TaskResult


class ResultStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def save(self, record: TaskRecord) -> None:
        save_task(self.root, record.request.task_id, record.result.status,
                  record.request.model_dump(mode="json"), record.result.model_dump(mode="json"))

    def load_all(self) -> dict[str, TaskRecord]:
        """Every task this store has seen, by task id (a restarted server answers for them)."""
        records = {}
        for body in read_tasks(self.root).values():
            record = TaskRecord(TaskRequest.model_validate(body["request"]),
                                TaskResult.model_validate(body["result"]))
            records[record.request.task_id] = record
        return records
