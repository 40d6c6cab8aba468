"""`tracetap migrate`: rewrite a store of an older schema version in the current layout, in place.

Version 1 stored every call whole; version 2 stores the compact form (store/compact_form.py). Each
session is rewritten on its own, atomically (store/compaction.py `rewrite_dir`): a crash leaves every
session either as it was or migrated, never a row twice. Version 3 keeps `rewards`, `trajectories` and
`rollouts` as Delta tables: each is switched on its own, atomically too (store/migrate_tables.py).
VERSION is written last, so an interrupted migration is finished by running it again; until then
readers and writers refuse the store (store/files.py `check_store`). The store's writer lock is held
throughout: no gateway records while a store is migrated.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tracetap.store import migrate_tables
from tracetap.store.compact_form import History, encode_row
from tracetap.store.compaction import rewrite_dir
from tracetap.store.delta import DELTA_TABLES
from tracetap.store.expansion import expand
from tracetap.store.files import StoreError, check_store, read_version, write_text_atomic
from tracetap.store.location import StorePath
from tracetap.store.paths import VERSION_FILE, session_of
from tracetap.store.schema import SCHEMA_VERSION, STORED_COMPLETIONS
from tracetap.store.snapshot import partitions, visible
from tracetap.store.tables import rows_to_table

WRITER_LOCK = ".writer.lock"  # the lock file StoreWriter holds
Progress = Callable[[str, int], None]  # (what was rewritten: "session <sid>" or "table <name>", its rows)


@dataclass
class Migration:
    """What a migration did (or, dry, would do)."""

    from_version: int
    sessions: int = 0  # sessions rewritten
    rows: int = 0  # completions rows rewritten
    files: int = 0  # completions files replaced
    current: int = 0  # sessions already in the current layout
    migrated: list[str] = field(default_factory=list)
    tables: dict[str, int] = field(default_factory=dict)  # rows of each table switched to Delta
    table_files: dict[str, int] = field(default_factory=dict)  # its old files (rollouts: task.json files)

    def add(self, sid: str, rows: int, files: int) -> None:
        self.sessions, self.rows, self.files = self.sessions + 1, self.rows + rows, self.files + files
        self.migrated.append(sid)

    def add_table(self, table: str, rows: int, files: int) -> None:
        self.tables[table], self.table_files[table] = rows, files


def _is_current(path: str | Path) -> bool:
    return "prompt_suffix_ids" in pq.read_schema(path).names


def to_current(table: pa.Table) -> pa.Table:
    """One session's rows (any version) in the current stored form."""
    full = expand(table, STORED_COMPLETIONS.names)
    history = History()
    return rows_to_table("completions", [encode_row(history, row) for row in full.to_pylist()])


@contextmanager
def _exclusive(root: Path) -> Iterator[None]:
    with open(root / WRITER_LOCK, "a") as owner:
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError(f"store {root} is open in a StoreWriter (a gateway?): stop it to migrate") from None
        yield


def _sessions(root: Path) -> list[Path]:
    return [Path(directory) for directory in partitions(root, "completions")]


def migrate_store(root: StorePath | str, dry_run: bool = False, progress: Progress | None = None) -> Migration:
    """Rewrite every session not yet in the current layout, then each table not yet a Delta table, then
    bump VERSION; `progress(what, rows)` is called after each session and table. A dry run only counts.
    Local stores only: an object store is written at the current version from its start."""
    root = check_store(root, older=True)
    if not isinstance(root, Path):
        raise StoreError(f"migrate rewrites a store on the local disk, not {root}")
    report = Migration(read_version(root) or SCHEMA_VERSION)
    with nullcontext() if dry_run else _exclusive(root):
        tables = {table: migrate_tables.pending(root, table) for table in DELTA_TABLES}  # may refuse: before any write
        _migrate_sessions(root, report, dry_run, progress or _quiet)
        _migrate_tables(root, tables, report, dry_run, progress or _quiet)
        if not dry_run and report.from_version < SCHEMA_VERSION:
            write_text_atomic(root / VERSION_FILE, f"{SCHEMA_VERSION}\n")
    return report


def _quiet(what: str, rows: int) -> None:
    """No progress report."""


def _migrate_sessions(root: Path, report: Migration, dry_run: bool, progress: Progress) -> None:
    """Rewrite the completions of each session still in the version-1 form (full rows) in the compact form."""
    for directory in _sessions(root):
        files = list(visible(directory).files)
        if all(map(_is_current, files)):
            report.current += 1
            continue
        sid = session_of(directory)[1]
        rows = sum(pq.read_metadata(p).num_rows for p in files) if dry_run else rewrite_dir(directory, to_current)
        report.add(sid, rows, len(files))
        progress(f"session {sid}", rows)


def _migrate_tables(root: Path, tables: dict[str, Path | None], report: Migration, dry_run: bool,
                    progress: Progress) -> None:
    """Switch each table still in the file layout of versions 1 and 2 (`tables`: where that layout is, by
    migrate_tables.pending) to a Delta table; a dry run counts it."""
    for table, source in tables.items():
        if dry_run:
            counts = None if source is None else migrate_tables.count(source, table)
        else:
            counts = migrate_tables.convert(root, table)
        if counts is not None:
            report.add_table(table, *counts)
            progress(f"table {table}", counts[0])
