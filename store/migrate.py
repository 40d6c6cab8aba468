"""`tracetap migrate`: rewrite a store of an older schema version in the current layout, in place.

Version 1 stored every call whole; version 2 stores the compact form (store/compact_form.py); version 3
keeps every table as a Delta table; version 4 gives every session an ownership chain (store/owners.py).
Each table is switched on its own, atomically (store/migrate_tables.py), its completions put in the compact
form on the way; then every session the store holds gets a chain. VERSION is written last,
so an interrupted migration is finished by running it again; until then readers and writers refuse the
store (store/files.py `check_store`), so no gateway records while a store is migrated; one recording
when the migration starts (a fresh heartbeat: store/owners.py) makes it refuse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tracetap.store import migrate_tables, owners
from tracetap.store.delta import DELTA_TABLES, committed_seqs, open_table
from tracetap.store.files import StoreError, check_store, read_version, write_text_atomic
from tracetap.store.location import StorePath
from tracetap.store.log_reading import logged_sessions
from tracetap.store.paths import VERSION_FILE
from tracetap.store.reading import read_sessions
from tracetap.store.schema import SCHEMA_VERSION

MIGRATION = "migration"  # the writer named in the ownership chains a migration starts
Progress = Callable[[str, int], None]  # (what was rewritten: "table <name>", its rows)


@dataclass
class Migration:
    """What a migration did (or, dry, would do)."""

    from_version: int
    tables: dict[str, int] = field(default_factory=dict)  # rows of each table switched to Delta
    table_files: dict[str, int] = field(default_factory=dict)  # its old files (rollouts: task.json files)

    def add_table(self, table: str, rows: int, files: int) -> None:
        self.tables[table], self.table_files[table] = rows, files


def _check_no_writer(root: StorePath) -> None:
    """Refuse a store a live writer records to (store/owners.py: its heartbeat is fresh)."""
    if any(owners.alive(root, writer) for writer in owners.heartbeat_writers(root)):
        raise StoreError(f"store {root} is open in a StoreWriter (a gateway?): stop it to migrate")


def _adopt_sessions(root: StorePath) -> None:
    """Give every session of the migrated store an ownership chain (a release), so a writer loads it instead
    of starting it anew (store/owners.py: a session without a chain is new to the store): those with a row,
    a committed call or a logged one."""
    sessions = set(read_sessions(root).column("session_id").to_pylist()) | logged_sessions(root)
    for sid in sorted(sessions | committed_seqs(open_table(root, "completions")).keys()):
        owners.adopt(root, sid, MIGRATION)


def migrate_store(root: StorePath | str, dry_run: bool = False, progress: Progress | None = None) -> Migration:
    """Switch each table not yet a Delta table, then give every session an ownership chain and bump VERSION;
    `progress(what, rows)` is called after each table. A dry run only counts. The file tables of versions 1
    and 2 are converted on the local disk only; an object store of version 3 (Delta tables already) gets
    its chains."""
    root = check_store(root, older=True)
    report = Migration(read_version(root) or SCHEMA_VERSION)
    if not isinstance(root, Path) and report.from_version < 3:
        raise StoreError(f"migrate converts the file tables of schema version {report.from_version} on the local "
                         f"disk only, not in {root}")
    if not dry_run:
        _check_no_writer(root)
    if isinstance(root, Path):
        tables = {table: migrate_tables.pending(root, table) for table in DELTA_TABLES}  # may refuse: before writes
        _migrate_tables(root, tables, report, dry_run, progress or _quiet)
    if not dry_run and report.from_version < SCHEMA_VERSION:
        _adopt_sessions(root)
        write_text_atomic(root / VERSION_FILE, f"{SCHEMA_VERSION}\n")
    return report


def _quiet(what: str, rows: int) -> None:
    """No progress report."""


def _migrate_tables(root: Path, tables: dict[str, Path | None], report: Migration, dry_run: bool,
                    progress: Progress) -> None:
    """Switch each table still in the file layout of versions 1 and 2 (`tables`: where that layout is, by
    migrate_tables.pending) to a Delta table; a dry run counts it."""
    for table, source in tables.items():
        if dry_run:
            counts = None if source is None else migrate_tables.count(root, source, table)
        else:
            counts = migrate_tables.convert(root, table)
        if counts is not None:
            report.add_table(table, *counts)
            progress(f"table {table}", counts[0])
