"""What a reader reads right now: the store's one visibility rule, applied to one listing.

Every reader goes through here: the Python reads (store/reader.py), the DuckDB views and the Polars
scans (store/catalog.py). A part file's name says what it covers: `part-<n>.parquet` holds exactly
the session's rows with seq 0..n-1. Per session:

    N = the largest n among part files (0 when there is none)
    visible = part-N  +  every non-part row with seq >= N      (everything else is superseded)

Non-part rows are the per-completion files `<seq:08d>-<cid>.parquet` (their name carries the seq, so
the rule picks files by name alone) and, with the group-commit log, rows of `log/*.jsonl` segments,
which are filtered by row: `Snapshot.log` lists the segments, `SessionFiles.covered` gives N.

Compaction (store/compaction.py) renames a part file in, then deletes what it merged, in seq order,
oldest part first. A directory read in several system calls while that runs is no snapshot: it may
miss files. So a completions directory counts as listed only when its files cover seqs 0..n-1 without
a hole and none of them was deleted since; otherwise it is listed again. A hole two identical listings
agree on is the store's own: read as is. A file deleted after the listing is the reader's to handle:
it runs again from a fresh snapshot (store/reading.py `retrying`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from tracetap.store.location import StorePath, exists, list_names, store_path
from tracetap.store.paths import (
    SESSION_ID_PATTERN,
    TABLE_DEPTH,
    classify,
    data_files,
    log_segments,
    loose_seq,
    part_covered,
    validate_session_id,
)

LISTINGS = 8  # listings of one directory before giving up on it settling
FIRST_PAUSE = 0.001  # seconds before listing an unsettled directory again, doubled each time: a
# compaction's deletes (and their directory fsync) take a few ms, listing at once would see them half done
PARTITION = "session_id="


class ListingRaced(FileNotFoundError):
    """A directory kept changing under every listing of it (compaction ran through each one)."""


@dataclass(frozen=True)
class SessionFiles:
    """The completions files a reader reads for one session, from one listing."""

    covered: int  # N: the part file holds seqs 0..N-1 (0 without a part file)
    files: tuple[str, ...]  # part-N (when there is one), then per-completion files with seq >= N


@dataclass(frozen=True)
class Snapshot:
    """One listing of the store: per session its completions files, per other table its files."""

    completions: dict[str, SessionFiles]  # by session id, sorted
    tables: dict[str, tuple[str, ...]]  # sessions, rewards, trajectories: every data file
    log: tuple[str, ...] = field(default=())  # group-commit log segments (rows with seq >= covered show)

    def files(self, table: str) -> list[str]:
        """The Parquet files a reader of `table` reads."""
        if table == "completions":
            return [path for listed in self.completions.values() for path in listed.files]
        if table not in self.tables:
            raise ValueError(f"table {table!r} is not in this snapshot; tables: {', '.join(self.tables)}")
        return list(self.tables[table])

    def covered(self) -> dict[str, int]:
        """Per session, the seqs 0..N-1 its part file covers: rows outside part files need seq >= N."""
        return {sid: listed.covered for sid, listed in self.completions.items()}


def visible(directory: StorePath | str) -> SessionFiles:
    """The rule above, on one listing of one completions directory."""
    parts, loose = classify(directory)
    covered = max(parts, default=0)
    head = [parts[covered]] if parts else []
    return SessionFiles(covered, tuple(head + [path for seq, path in sorted(loose.items()) if seq >= covered]))


def _without_hole(files: tuple[str, ...]) -> bool:
    """Whether the files cover seqs 0..n-1: the head part (if any) then consecutive per-call files."""
    start = (part_covered(files[0]) or 0) if files else 0
    seqs = [seq for seq in map(loose_seq, files) if seq is not None]
    return seqs == list(range(start, start + len(seqs)))


def _settled(listed: SessionFiles) -> bool:
    """Whether a listing is whole: nothing it shows was deleted since, and its seqs have no hole."""
    return all(map(exists, listed.files)) and _without_hole(listed.files)


def session_files(directory: StorePath | str) -> SessionFiles:
    """The files to read for one completions directory, from a listing that did not race compaction."""
    listed = visible(directory)
    for attempt in range(LISTINGS):
        if _settled(listed):
            return listed
        time.sleep(FIRST_PAUSE * 2**attempt)
        again = visible(directory)
        if again == listed:  # a hole in the store itself: read what is there
            return listed
        listed = again
    raise ListingRaced(f"{directory} changed during each of {LISTINGS} listings")


def partitions(root: StorePath | str, table: str, session_ids: Collection[str] | None = None) -> list[str]:
    """The `session_id=<sid>` directories of `table` (all, or those of `session_ids`), sorted."""
    if table not in TABLE_DEPTH:
        raise ValueError(f"unknown table {table!r}; tables: {', '.join(TABLE_DEPTH)}")
    base = f"{store_path(root)}/{table}"
    parents = [f"{base}/{name}" for name in _names(base, "builder=")] if table == "trajectories" else [base]
    if session_ids is None:
        return [f"{parent}/{name}" for parent in parents for name in _names(parent, PARTITION)
                if SESSION_ID_PATTERN.fullmatch(name.removeprefix(PARTITION))]
    wanted = sorted(map(validate_session_id, session_ids))
    return [f"{parent}/{PARTITION}{sid}" for parent in parents for sid in wanted]


def _names(directory: str, prefix: str) -> list[str]:
    """The sorted entry names in `directory` that start with `prefix` (none when it is missing)."""
    try:
        return sorted(name for name in list_names(directory) if name.startswith(prefix))
    except FileNotFoundError:
        return []


def _completions(root: StorePath, session_ids: Collection[str] | None) -> dict[str, SessionFiles]:
    directories = partitions(root, "completions", session_ids)
    listed = {os.path.basename(path).removeprefix(PARTITION): session_files(path) for path in directories}
    return {sid: files for sid, files in listed.items() if files.files}


def snapshot(root: StorePath | str, tables: Iterable[str] = tuple(TABLE_DEPTH),
             session_ids: Collection[str] | None = None) -> Snapshot:
    """The files every reader of `tables` reads now (only `session_ids`' partitions when given)."""
    root, tables = store_path(root), list(tables)
    # the log is listed first: a segment is deleted only after the parts that cover it are in place
    log = tuple(map(str, log_segments(root))) if "completions" in tables else ()
    others = {table: tuple(path for directory in partitions(root, table, session_ids)
                           for path in data_files(directory))
              for table in tables if table != "completions"}
    listed = _completions(root, session_ids) if "completions" in tables else {}
    return Snapshot(listed, others, log)
