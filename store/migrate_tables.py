"""Schema version 3's switch of every table to a Delta table (store/delta.py).

Up to version 2 each was a tree of files: `completions/session_id=<sid>/` (a part file `part-<n>.parquet`
holding seqs 0..n-1 and per-call files `<seq:08d>-<id>.parquet`, plus the rows of the group-commit log),
`sessions/session_id=<sid>/session.parquet`, `rewards/session_id=<sid>/<evaluator>.parquet`,
`trajectories/builder=<b>/session_id=<sid>/*.parquet` and `rollouts/task_id=<id>/task.json`. A table is
switched on its own, in steps that each leave a state the next run recognises:

1. the old tree is renamed to a hidden staging name, `.<table>.v2` (one atomic rename);
2. its rows, each checked against the schema, become the Delta table at `<table>/` in one commit, which
   creates the table: before that commit there is no table, after it every row is in it. A session's
   completions are what version 2 showed (its highest part, the per-call files past it, then its log rows
   past those), in the compact form (version 1 stored whole rows);
3. the staging tree is renamed to `.<table>.v2.done`, then (completions) the log segments go, then it is
   deleted.

A run that finds a staging tree was stopped in step 2 (or just after): it drops whatever Delta table
`<table>/` holds and writes it again from the staging tree, so no row is lost or written twice. A
`.done` tree is what step 3 had not finished deleting; log rows left behind are committed once by the
next writer (store/compaction.py). Local stores only (store/migrate.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tracetap.store import migrate_completions
from tracetap.store.delta import DELTA_TABLES, WRITER_KEY, configuration, file_properties, storage_schema, table_uri
from tracetap.store.files import StoreError, read_parquet
from tracetap.store.location import fsync_dir, remove
from tracetap.store.paths import LOG_DIR, log_segments, validate_name
from tracetap.store.schema import STORED_TABLES
from tracetap.store.tables import rows_to_table

OLD_FILES = {"completions": "session_id=*/*.parquet", "sessions": "session_id=*/session.parquet",
             "rewards": "session_id=*/*.parquet", "trajectories": "builder=*/session_id=*/*.parquet",
             "rollouts": "task_id=*/task.json"}  # each table's data files in the old layout, as globs
LOOSE_NAME = re.compile(r"(\d{8,})-(.+)\.parquet")  # version 2's per-call files and part files
PART_NAME = re.compile(r"part-(\d+)\.parquet")
DELTA_FILE = re.compile(r"part-\d{5}-[0-9a-f-]{36}-c\d{3}(\.[a-z0-9]+)?\.parquet")  # deltalake's data file names
WRITER = "tracetap migrate"  # the Delta commit's writer (`tracetap history`)


def _staging(root: Path, table: str) -> Path:
    return root / f".{table}.v2"


def _done(root: Path, table: str) -> Path:
    return root / f".{table}.v2.done"


def pending(root: Path, table: str) -> Path | None:
    """Where `table` still is in the old layout: an interrupted run's staging tree, else `<table>/` when it
    holds anything and no Delta table; None when there is nothing to convert."""
    if _staging(root, table).is_dir():
        return _staging(root, table)
    directory = root / table
    if not (directory / "_delta_log").exists():
        if directory.is_dir() and any(directory.iterdir()):
            return directory
        return directory if table == "completions" and log_segments(root) else None  # calls all in the log
    if old_files(directory, table):  # files deltalake did not name: the old layout
        raise StoreError(f"{directory} holds both a Delta table and files of the old layout (a newer tracetap "
                         "wrote into the store before it was migrated): migrate cannot tell which rows are current; "
                         "move one of them out of the store first")
    return None


def old_files(directory: Path, table: str) -> list[Path]:
    """The data files of an old-layout tree (hidden and temp names skipped: no reader ever saw them; so are
    the names deltalake gives its data files, which a Delta table partitioned as the old tree was holds)."""
    return sorted(path for path in directory.glob(OLD_FILES[table])
                  if not path.name.startswith(".") and not DELTA_FILE.fullmatch(path.name))


def count(root: Path, directory: Path, table: str) -> tuple[int, int]:
    """(rows, files) an old-layout tree holds, from file footers alone (completions: the rows readers showed,
    read): what a dry run reports."""
    files = old_files(directory, table)
    if table == "rollouts":
        return len(files), len(files)
    if table == "completions":  # what readers showed: read as the conversion reads it
        return sum(rows.num_rows for _, rows in migrate_completions.all_sessions(directory, root)), len(files)
    return sum(map(_footer_rows, files)), len(files)


def _footer_rows(path: Path) -> int:
    try:
        return int(pq.read_metadata(path).num_rows)
    except (OSError, pa.ArrowException) as error:
        raise StoreError(f"{path} is not a readable Parquet file: {error}") from None


def convert(root: Path, table: str) -> tuple[int, int] | None:
    """Switch `table` to a Delta table (module doc); (rows, files) converted, None when nothing was pending."""
    _remove(_done(root, table))
    source = pending(root, table)
    if source is None:
        return None
    staging = _staging(root, table)
    if not source.exists():
        source.mkdir()  # completions all in the log
    if source != staging:
        _rename(source, staging)
    _remove(root / table)  # a table an interrupted run may have left: its rows are all in staging
    files = old_files(staging, table)
    rows = _commit(root, table, _Rows(table, files) if table != "completions" else _Sessions(root, staging))
    _make_durable(root / table)  # before the rows' only other copy goes (deltalake promises no fsync)
    _rename(staging, _done(root, table))
    if table == "completions":
        segments = log_segments(root)
        for segment in segments:
            remove(segment)
        if segments:
            fsync_dir(root / LOG_DIR)
    _remove(_done(root, table))
    return rows, len(files)


def _rename(source: Path, target: Path) -> None:
    os.rename(source, target)
    fsync_dir(target.parent)


def _remove(directory: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)


def _make_durable(directory: Path) -> None:
    """fsync every file and directory of a tree."""
    for parent, _, names in os.walk(directory):
        for path in (*(os.path.join(parent, name) for name in names), parent):
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)


def _commit(root: Path, table: str, rows: _Rows | _Sessions) -> int:
    """Write `rows` as a new Delta table in one commit, streamed file by file (session by session); rows
    written. A file that cannot be read or whose rows do not fit the schema stops it before the commit."""
    from deltalake import CommitProperties, write_deltalake

    stream = pa.RecordBatchReader.from_batches(storage_schema(table), rows.batches())
    try:
        write_deltalake(table_uri(root, table), stream, mode="error", partition_by=list(DELTA_TABLES[table]) or None,
                        configuration=configuration(table), writer_properties=file_properties(table),
                        commit_properties=CommitProperties(custom_metadata={WRITER_KEY: WRITER}))
    except Exception:
        if rows.failure is not None:  # deltalake wraps it in its own error, traceback and all
            raise rows.failure from None
        raise
    return rows.count


class _Rows:
    """The checked rows of old-layout files, as the batches deltalake pulls; counts them and keeps the
    first failure, which deltalake would otherwise report as its own."""

    def __init__(self, table: str, files: list[Path]) -> None:
        self.table, self.files = table, files
        self.count = 0
        self.failure: StoreError | None = None

    def batches(self) -> Iterator[pa.RecordBatch]:
        for path in self.files:
            try:
                checked = _checked(self.table, path)
            except (ValueError, KeyError, TypeError, OSError) as error:
                self.failure = StoreError(f"{path} cannot be migrated: {error}")
                raise self.failure from None
            self.count += checked.num_rows
            yield from checked.to_batches()


class _Sessions(_Rows):
    """Version 2's completions, session by session (store/migrate_completions.py), checked; counted as _Rows."""

    def __init__(self, root: Path, directory: Path) -> None:
        super().__init__("completions", [])
        self.root, self.directory = root, directory

    def batches(self) -> Iterator[pa.RecordBatch]:
        for sid, rows in migrate_completions.all_sessions(self.directory, self.root):
            try:
                checked = rows_to_table("completions", rows.to_pylist())
            except (ValueError, KeyError, TypeError) as error:
                self.failure = StoreError(f"session {sid} cannot be migrated: {error}")
                raise self.failure from None
            self.count += checked.num_rows
            yield from checked.to_batches()


def _checked(table: str, path: Path) -> pa.Table:
    """One old file's rows through rows_to_table, which checks each against the schema."""
    if table == "rollouts":
        return rows_to_table(table, [task_row(path)])
    return rows_to_table(table, read_parquet([path], STORED_TABLES[table]).to_pylist())


def task_row(path: Path) -> dict:
    """The `rollouts` row of an old `task_id=<id>/task.json` (store/tasks.py `save_task` makes the same);
    when it was last written is the file's modification time."""
    body = json.loads(path.read_bytes())
    return {"task_id": validate_name(path.parent.name.removeprefix("task_id="), "task id"),
            "status": body["result"]["status"], "updated_at": datetime.fromtimestamp(path.stat().st_mtime, UTC),
            "request_json": json.dumps(body["request"]), "result_json": json.dumps(body["result"])}
