"""Merge a session's per-completion files into one part file, never showing readers a row twice.

The design: a part file's name says what it covers. `part-<n>.parquet` holds exactly the rows with
seq 0..n-1, and readers see part-N (the largest) plus the rows with seq >= N (the rule lives in
store/snapshot.py). Rows in the group-commit log (store/commit_log.py) count as per-completion files: a session's log
rows with seq >= N are visible, and compaction merges them like files; the writer deletes a log
segment once parts cover every row in it.

Compaction (under an exclusive lock file, so two compactors never race) takes part-N and the run of
per-completion files and log rows with seq N, N+1, ... up to the first gap, writes `part-<k>`
atomically (temp name, fsync, rename), and only then deletes the files it merged. The rename is the
single switch: before it readers use the old files, after it the new part; a crash between the rename and the deletes
leaves superseded files that the rule hides and the next compaction removes. Files written while
compaction runs have seq >= k (the writer assigns seqs in order and writes a session's files one at
a time), so they are neither merged, nor deleted, nor hidden. Stopping at a gap means a file still
being written can never be skipped.

One race remains for readers: a query that listed the directory just before the deletes may fail
to open a deleted file. Deletes go in seq order, oldest part first, and every reader follows
store/reading.py, which re-runs such a read from a fresh listing that shows the new part. A writer
(the gateway) deletes superseded files only after a grace period (store/retirement.py), so a read
that overlaps its compactions need not lose that race again and again.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import pyarrow as pa
import pyarrow.compute as pc
from tracetap.store.files import read_parquet, write_parquet_atomic
from tracetap.store.location import ObjectPath, StorePath, ensure_dir, fsync_dir, is_dir, remove, store_path
from tracetap.store.log_reading import log_rows, log_seqs, logged_sessions
from tracetap.store.paths import (
    SESSION_ID_PATTERN,
    classify,
    data_files,
    part_covered,
    part_name,
    session_dir,
    session_of,
    validate_session_id,
)
from tracetap.store.reading import retrying
from tracetap.store.schema import STORED_COMPLETIONS
from tracetap.store.snapshot import partitions, visible

LOCK_NAME = ".compact.lock"
PART_COMPRESSION = "zstd"  # parts hold a session's repeated JSON templates: smaller than snappy (store_size.py)
STALE_TMP_SECONDS = 3600.0


def _logged(directory: StorePath) -> pa.Table:
    """The session's rows in the group-commit log (store/commit_log.py), all columns."""
    return log_rows(*session_of(directory))


def next_seq(directory: StorePath | str) -> int:
    """The seq the next completion of this session gets: one past the highest on disk or in the log (read
    first: rows that leave the log for a part meanwhile are then found in the part)."""
    logged = log_seqs(*session_of(directory))
    parts, loose = classify(directory)
    return max([*parts, *(seq + 1 for seq in [*loose, *logged])], default=0)


@contextmanager
def _locked(directory: StorePath) -> Iterator[None]:
    """Local compactions of one session run one at a time. An object store has no lock: there a session
    is compacted by the gateway recording it (or one recovering its log), and two compactions that do
    meet write the same part name with the same rows and delete only their own inputs."""
    if isinstance(directory, ObjectPath):
        yield
        return
    with open(directory / LOCK_NAME, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


Remover = Callable[[Sequence[str | StorePath], StorePath], None]  # (files, their directory): delete them


def remove_now(paths: Sequence[str | StorePath], directory: StorePath) -> None:
    """Delete at once (a writer serving calls defers it instead: store/retirement.py)."""
    for path in paths:
        remove(path)
    if paths:
        fsync_dir(directory)


def _stale_temps(directory: StorePath) -> list[str | StorePath]:
    """Temp files a crashed writer left behind (old enough that no write can still own them); an
    object store has none (a PUT needs no temp name)."""
    if isinstance(directory, ObjectPath):
        return []
    cutoff = time.time() - STALE_TMP_SECONDS
    stale: list[str | StorePath] = []
    for path in directory.glob(".*.tmp"):
        try:
            if path.stat().st_mtime < cutoff:
                stale.append(path)
        except FileNotFoundError:  # a live write renamed it between the listing and the stat
            continue
    return stale


def _merge(directory: StorePath, inputs: list[str], logged: pa.Table, covered: int) -> pa.Table:
    """The rows of `inputs` and `logged`, checked to be exactly seqs 0..covered-1 of one session, in order."""
    table = pa.concat_tables([read_parquet(inputs, STORED_COMPLETIONS), logged]).sort_by("seq")
    if table.column("seq").to_pylist() != list(range(covered)):
        raise RuntimeError(f"{directory}: files to merge do not hold seqs 0..{covered - 1}; left unchanged")
    if len(set(table.column("session_id").to_pylist())) > 1:
        raise RuntimeError(f"{directory}: files to merge hold rows of several sessions; left unchanged")
    return table


def compact_dir(directory: StorePath, remover: Remover = remove_now) -> int:
    """Compact one session directory and its log rows; returns how many rows were merged. `remover`
    deletes the files the new part supersedes. On an object store another gateway's compaction of the
    session may delete an input first: then it runs again from a fresh listing (locally the lock rules
    that out)."""
    return retrying(lambda: _compact(directory, remover))


def _compact(directory: StorePath, remover: Remover) -> int:
    logged = _logged(directory)  # rows appended after this read have higher seqs: left for next time
    if not logged.num_rows and not is_dir(directory):
        return 0
    ensure_dir(directory)  # a session seen only in the log has no directory yet
    with _locked(directory):
        parts, loose = classify(directory)
        start = max(parts, default=0)
        in_log = set(logged.column("seq").to_pylist())
        end = start
        while end in loose or end in in_log:
            end += 1
        superseded = [p for n, p in parts.items() if n < start] + [p for s, p in loose.items() if s < start]
        if end > start:
            inputs = ([parts[start]] if start in parts else []) + [loose[s] for s in range(start, end) if s in loose]
            seqs = pc.field("seq")
            merged = _merge(directory, inputs, logged.filter((seqs >= start) & (seqs < end)), end)
            write_parquet_atomic(directory / part_name(end), merged, PART_COMPRESSION)
            superseded += inputs
        remover(superseded + _stale_temps(directory), directory)
    return end - start


def rewrite_dir(directory: StorePath, rewrite: Callable[[pa.Table], pa.Table]) -> int:
    """Replace one session's live files by a single part holding `rewrite(its rows)`, by the same
    switch as compaction (the part is renamed in, then what it supersedes is deleted); returns the
    number of rows. A part of the same name is replaced whole by the rename."""
    logged = _logged(directory)
    with _locked(directory):
        files = list(visible(directory).files)
        covered = next_seq(directory)
        head = part_covered(files[0]) if files and part_covered(files[0]) is not None else 0
        table = rewrite(_merge(directory, files, logged.filter(pc.field("seq") >= head), covered))
        write_parquet_atomic(directory / part_name(covered), table, PART_COMPRESSION)
        old = [path for path in data_files(directory) if os.path.basename(path) != part_name(covered)]
        remove_now(old + _stale_temps(directory), directory)
    return table.num_rows


def compact_session(root: StorePath | str, sid: str, remover: Remover = remove_now) -> int:
    """Compact one session's completions; returns how many rows were merged."""
    return compact_dir(session_dir(store_path(root), "completions", validate_session_id(sid)), remover)


def recorded_sessions(root: StorePath | str) -> list[str]:
    """Ids of the sessions with completions (rows in the log, or a completions directory), sorted. The log
    is read first: a segment compacted and deleted meanwhile had its rows in parts before, which the
    directory listing then shows (listed the other way round, such a session could be in neither)."""
    logged = logged_sessions(root)
    in_dirs = {session_of(directory)[1] for directory in partitions(root, "completions")}
    return sorted(sid for sid in logged | in_dirs if SESSION_ID_PATTERN.fullmatch(sid))


def compact_store(root: StorePath | str) -> dict[str, int]:
    """Compact every session of the store: {session_id: rows merged} for sessions that changed.

    What the new parts supersede is deleted once every session is done: a read listing the store during
    the pass finds every file it listed, and one straddling the final deletions loses that race once (its
    retry lists the new parts), however many sessions the pass takes."""
    superseded: list[tuple[Sequence[str | StorePath], StorePath]] = []
    merged = {}
    try:
        for sid in recorded_sessions(root):
            if count := compact_session(root, sid, lambda paths, directory: superseded.append((paths, directory))):
                merged[sid] = count
    finally:
        for paths, directory in superseded:
            remove_now(paths, directory)
    return merged
