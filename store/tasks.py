"""Rollout task records: each task's request and its result so far, one row per task in `rollouts`.

The rollout server writes a task's row after every session that ends and once more when the task ends,
always before the callback, so a trainer whose receiver was down, or a restarted server, can still read
the result. A write replaces the task's row in one Delta commit (store/delta.py).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
from tracetap.store.delta import open_table, read, replace
from tracetap.store.location import StorePath
from tracetap.store.paths import validate_name
from tracetap.store.tables import rows_to_table


def save_task(root: StorePath | str, task_id: str, status: str, request: dict, result: dict,
              writer: str = "tracetap rollout") -> None:
    """Replace the record of task `task_id` (its request and result as JSON-ready dicts)."""
    task_id = validate_name(task_id, "task id")
    row = {"task_id": task_id, "status": status, "updated_at": datetime.now(UTC),
           "request_json": json.dumps(request), "result_json": json.dumps(result)}
    replace(root, "rollouts", rows_to_table("rollouts", [row]), f"task_id = '{task_id}'", writer)


def read_tasks(root: StorePath | str) -> dict[str, dict]:
    """Every task record, by task id: `{"request": ..., "result": ...}`."""
    return _records(read(open_table(root, "rollouts"), "rollouts"))


def read_task(root: StorePath | str, task_id: str) -> dict | None:
    """One task's record, or None when the store has none for it."""
    where = pc.field("task_id") == validate_name(task_id, "task id")
    return _records(read(open_table(root, "rollouts"), "rollouts", where)).get(task_id)


def _records(table: pa.Table) -> dict[str, dict]:
    return {row["task_id"]: {"request": json.loads(row["request_json"]), "result": json.loads(row["result_json"])}
            for row in table.to_pylist()}
