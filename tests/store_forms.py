"""Run store-reading tests on every store form a user can have: the read-side suites call `as_form(root)`
once a test store is written, and scripts/test.sh runs them again with TRACETAP_TEST_STORE_FORM set.

- `v3` (default): the store as the writers left it (compact rows, log segments, parts; Delta tables);
- `v2-migrated`: the same rows rewritten in schema version 2 (rewards, trajectories and rollouts in their
  file layouts, VERSION 2), then `tracetap migrate`d;
- `v1-migrated`: as v2, with every session's completions as full rows in one part (VERSION 1), then migrated.

Readers refuse a store older than the current version, so the older forms are only ever read migrated.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tracetap.store import StoreReader, migrate_store, session_dir
from tracetap.store.delta import DELTA_TABLES, open_table, read

FORMS = ("v3", "v2-migrated", "v1-migrated")
V1_SCHEMA = pq.read_schema(Path(__file__).parent / "fixtures/store-v1/completions/session_id=linear/part-5.parquet")


def store_form() -> str:
    form = os.environ.get("TRACETAP_TEST_STORE_FORM", "v3")
    if form not in FORMS:
        raise ValueError(f"TRACETAP_TEST_STORE_FORM must be one of {FORMS}, not {form!r}")
    return form


def as_form(root: Path, form: str | None = None) -> Path:
    """Rewrite the store at `root` (no writer open on it) in `form` (default: the environment's)."""
    form = form or store_form()
    if form != "v3":
        downgrade(root, 1 if form == "v1-migrated" else 2)
        migrate_store(root)
    return root


def downgrade(root: Path, version: int) -> None:
    """Rewrite the store in schema version 2 (or 1: its completions as full rows too)."""
    if version == 1:
        _full_completions(root)
    for table in DELTA_TABLES:
        rows = read(open_table(root, table), table)
        shutil.rmtree(root / table, ignore_errors=True)
        (root / table).mkdir()  # a version-2 writer made the directories, empty until written
        WRITE_OLD[table](root, rows)
    (root / "VERSION").write_text(f"{version}\n")


def _full_completions(root: Path) -> None:
    """Every session's full rows as one v1 part file (the v1 columns, in the v1 fixture's schema)."""
    reader = StoreReader(root)
    tables = {sid: reader.completions(sid, V1_SCHEMA.names) for sid in reader.session_ids()}
    shutil.rmtree(root / "log", ignore_errors=True)
    for sid, table in tables.items():
        directory = session_dir(root, "completions", sid)
        shutil.rmtree(directory, ignore_errors=True)  # rows still only in the log have none
        directory.mkdir(parents=True)
        pq.write_table(table.select(V1_SCHEMA.names).cast(V1_SCHEMA), directory / f"part-{table.num_rows}.parquet")


def _write_rewards(root: Path, rows: pa.Table) -> None:
    """`rewards/session_id=<sid>/<evaluator>.parquet`."""
    for (sid, evaluator), group in _groups(rows, "session_id", "evaluator").items():
        _write(root / "rewards" / f"session_id={sid}" / f"{evaluator}.parquet", group)


def _write_trajectories(root: Path, rows: pa.Table) -> None:
    """`trajectories/builder=<b>/session_id=<sid>/part-0.parquet`."""
    for (builder, sid), group in _groups(rows, "builder", "session_id").items():
        _write(root / "trajectories" / f"builder={builder}" / f"session_id={sid}" / "part-0.parquet", group)


def _write_rollouts(root: Path, rows: pa.Table) -> None:
    """`rollouts/task_id=<id>/task.json`: the task's request and result."""
    for row in rows.to_pylist():
        path = root / "rollouts" / f"task_id={row['task_id']}" / "task.json"
        path.parent.mkdir(parents=True)
        body = {"request": json.loads(row["request_json"]), "result": json.loads(row["result_json"])}
        path.write_text(json.dumps(body, indent=1))


WRITE_OLD = {"rewards": _write_rewards, "trajectories": _write_trajectories, "rollouts": _write_rollouts}


def _groups(rows: pa.Table, *keys: str) -> dict[tuple[str, ...], pa.Table]:
    """The rows split by the values of `keys`."""
    groups: dict[tuple[str, ...], list[dict]] = {}
    for row in rows.to_pylist():
        groups.setdefault(tuple(row[key] for key in keys), []).append(row)
    return {key: pa.Table.from_pylist(group, schema=rows.schema) for key, group in groups.items()}


def _write(path: Path, rows: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows, path)
