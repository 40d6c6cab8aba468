"""A store's Delta table history (which commit wrote each version, and what) and their vacuum.

Every write to a Delta table (store/delta.py) leaves the files it replaced on disk, so readers of an
older version, and time travel, still find them. `vacuum` deletes the replaced files once no version
within the retention needs them; `history` lists the versions and what wrote each one. Both work over
every Delta table the store has (DELTA_TABLES), skipping the ones not written yet.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from tracetap.store.delta import DELTA_TABLES, READ_VERSIONS_KEY, WRITER_KEY, open_table
from tracetap.store.files import StoreError
from tracetap.store.location import StorePath, list_names, store_path

if TYPE_CHECKING:
    from deltalake import DeltaTable

# Delta's own default, and longer than any reader's run: a reader holding an older version keeps its files
DEFAULT_RETAIN_HOURS = 168
# from this retention on, vacuum lists the whole table (below it: only files the log says were removed);
# no write takes this long, so a file it finds unreferenced and older is no write's under way
FULL_SCAN_HOURS = 24
VACUUM_WRITER = "tracetap vacuum"  # the writer named in the commits a vacuum that deleted files leaves
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class TableVersion:
    """One committed version of a Delta table: when, which operation, and what wrote it."""

    table: str
    version: int
    timestamp: datetime  # UTC
    operation: str  # Delta's name: CREATE TABLE, WRITE, VACUUM START, ...
    writer: str | None  # the commit's `tracetap.writer`; None for a commit that names none (another engine's)
    rows_added: int | None
    files_added: int | None
    files_removed: int | None
    # the commit's `tracetap.read_versions`: the table versions its rows were made from (a build's); None: unrecorded
    read_versions: dict[str, int | None] | None = field(default=None, hash=False)


def history(root: StorePath | str, tables: Iterable[str] | None = None,
            limit: int | None = None) -> list[TableVersion]:
    """The versions of `tables` (default: every Delta table written so far), newest first per table,
    at most `limit` per table. An unknown table name is a ValueError."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be 0 or more, not {limit}")
    versions: list[TableVersion] = []
    for table, delta in _open_tables(root, tables):
        with _reading(table):
            commits = delta.history(limit)
        versions += [_version(table, commit) for commit in commits]
    return versions


def vacuum(root: StorePath | str, retain_hours: int = DEFAULT_RETAIN_HOURS,
           dry_run: bool = False) -> dict[str, list[str]]:
    """Delete the data files that no version committed within the last `retain_hours` needs, per table
    (the files' paths in it; a dry run deletes nothing and lists what it would delete).

    Any retention from 0 up is accepted: a reader still on a version older than the retention (a long
    query, time travel) then fails on files deleted under it. From FULL_SCAN_HOURS on, files no commit
    added (a write that died) go too. The log is kept: `history` still lists every version."""
    if retain_hours < 0:
        raise ValueError(f"retention must be 0 hours or more, not {retain_hours}")
    root = store_path(root)
    return {table: _vacuum_table(root, table, delta, retain_hours, dry_run)
            for table, delta in _open_tables(root, None)}


def _vacuum_table(root: StorePath, table: str, delta: DeltaTable, retain_hours: int, dry_run: bool) -> list[str]:
    """One table's vacuum: the files it deletes, listed (a dry run) before deleting them.

    From FULL_SCAN_HOURS on, the whole table is listed, which also finds files a checkpoint forgot the
    removal of (the log keeps a removal a week) and files of writes that died before their commit;
    below it only files the log says were removed go, so a write still under way keeps its new files.
    The real run commits only when something is there to delete, naming VACUUM_WRITER."""
    from deltalake import CommitProperties

    options: dict[str, Any] = {"retention_hours": retain_hours, "enforce_retention_duration": False,
                               "full": retain_hours >= FULL_SCAN_HOURS}
    with _reading(table):
        doomed = _present(root / table, delta.vacuum(dry_run=True, **options))
        if doomed and not dry_run:
            commit = CommitProperties(custom_metadata={WRITER_KEY: VACUUM_WRITER})
            delta.vacuum(dry_run=False, commit_properties=commit, **options)
    return doomed


def _present(location: StorePath, files: list[str]) -> list[str]:
    """The files (paths in the table at `location`) still there: deltalake lists a file an earlier vacuum
    deleted again until the log forgets its removal. One listing per folder."""
    on_disk: set[str] = set()
    for folder in {name.rpartition("/")[0] for name in files}:
        names = _names(location.joinpath(*folder.split("/")) if folder else location)
        on_disk.update(f"{folder}/{name}" if folder else name for name in names)
    return sorted(name for name in files if name in on_disk)


def _names(folder: StorePath) -> list[str]:
    """The names in `folder`; none when it is gone (an object store has no empty folders)."""
    try:
        return list_names(folder)
    except FileNotFoundError:
        return []


def _open_tables(root: StorePath | str, tables: Iterable[str] | None) -> Iterator[tuple[str, DeltaTable]]:
    """(name, latest version) of each of `tables` that exists; the names are checked before any is opened."""
    root = store_path(root)
    names = list(DELTA_TABLES) if tables is None else list(dict.fromkeys(tables))
    unknown = [name for name in names if name not in DELTA_TABLES]
    if unknown:
        raise ValueError(f"unknown Delta table(s) {', '.join(unknown)}; tables: {', '.join(DELTA_TABLES)}")
    for name in names:
        with _reading(name):
            delta = open_table(root, name)
        if delta is not None:
            yield name, delta


@contextmanager
def _reading(table: str) -> Iterator[None]:
    """deltalake's errors (a damaged log, a file gone, a denied read) as a StoreError naming the table."""
    from deltalake.exceptions import DeltaError

    try:
        yield
    except (DeltaError, OSError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise StoreError(f"Delta table {table}: {first_line}") from error


def _version(table: str, commit: dict[str, Any]) -> TableVersion:
    """A TableVersion from one commit of DeltaTable.history() (custom metadata sits at its top level)."""
    metrics = commit.get("operationMetrics") or {}
    return TableVersion(
        table=table, version=int(commit["version"]),
        timestamp=_EPOCH + timedelta(milliseconds=int(commit["timestamp"])),
        operation=str(commit.get("operation", "")), writer=_text(commit.get(WRITER_KEY)),
        rows_added=_count(metrics.get("num_added_rows")), files_added=_count(metrics.get("num_added_files")),
        files_removed=_count(metrics.get("num_removed_files")), read_versions=_versions(commit.get(READ_VERSIONS_KEY)))


def _versions(value: object) -> dict[str, int | None] | None:
    """A commit's recorded read versions; None when it has none (or another engine wrote something else there)."""
    try:
        versions = json.loads(value) if isinstance(value, str) else None
    except json.JSONDecodeError:
        return None
    if not isinstance(versions, dict) or not all(v is None or type(v) is int for v in versions.values()):
        return None
    return {str(table): version for table, version in versions.items()}


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) else None
