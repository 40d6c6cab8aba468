"""Merge a session's per-completion files into one part file, never showing readers a row twice.

The design: a part file's name says what it covers. `part-<n>.parquet` holds exactly the rows with
seq 0..n-1, and readers see part-N (the largest) plus the rows with seq >= N (the rule lives in
store/snapshot.py). Compaction (under an exclusive lock file, so two compactors never race) takes part-N and the run
of per-completion files with seq N, N+1, ... up to the first gap, writes `part-<k>` atomically (temp
name, fsync, rename), and only then deletes what it merged. The rename is the single switch: before
it readers use the old files, after it the new part; a crash between the rename and the deletes
leaves superseded files that the rule hides and the next compaction removes. Files written while
compaction runs have seq >= k (the writer assigns seqs in order and writes a session's files one at
a time), so they are neither merged, nor deleted, nor hidden. Stopping at a gap means a file still
being written can never be skipped.

One race remains for readers: a query that listed the directory just before the deletes may fail
to open a deleted file. Deletes go in seq order, oldest part first, and every reader follows
store/snapshot.py and store/reading.py, which re-run such a read from a fresh listing that shows the new
part.
"""

from __future__ import annotations

import fcntl
import time
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
from tracetap.store.files import fsync_dir, read_parquet, write_parquet_atomic
from tracetap.store.paths import classify, part_name, session_dir, validate_session_id
from tracetap.store.schema import COMPLETIONS

LOCK_NAME = ".compact.lock"
STALE_TMP_SECONDS = 3600.0


def next_seq(directory: Path) -> int:
    """The seq the next completion of this session gets: one past the highest on disk."""
    parts, loose = classify(directory)
    return max([*parts, *(seq + 1 for seq in loose)], default=0)


@contextmanager
def _locked(directory: Path):
    with open(directory / LOCK_NAME, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove(paths: list[str | Path], directory: Path) -> None:
    for path in paths:
        Path(path).unlink(missing_ok=True)
    if paths:
        fsync_dir(directory)


def _stale_temps(directory: Path) -> list[Path]:
    """Temp files a crashed writer left behind (old enough that no write can still own them)."""
    cutoff = time.time() - STALE_TMP_SECONDS
    stale = []
    for path in directory.glob(".*.tmp"):
        try:
            if path.stat().st_mtime < cutoff:
                stale.append(path)
        except FileNotFoundError:  # a live write renamed it between the listing and the stat
            continue
    return stale


def _merge(directory: Path, inputs: list[str], covered: int) -> pa.Table:
    """The rows of `inputs`, checked to be exactly seqs 0..covered-1 of one session, in order."""
    table = read_parquet(inputs, COMPLETIONS)
    if table.column("seq").to_pylist() != list(range(covered)):
        raise RuntimeError(f"{directory}: files to merge do not hold seqs 0..{covered - 1}; left unchanged")
    if len(set(table.column("session_id").to_pylist())) > 1:
        raise RuntimeError(f"{directory}: files to merge hold rows of several sessions; left unchanged")
    return table


def compact_dir(directory: Path) -> int:
    """Compact one session directory; returns how many per-completion files were merged."""
    if not directory.is_dir():
        return 0
    with _locked(directory):
        parts, loose = classify(directory)
        start = max(parts, default=0)
        end = start
        while end in loose:
            end += 1
        superseded = [p for n, p in parts.items() if n < start] + [p for s, p in loose.items() if s < start]
        if end > start:
            inputs = ([parts[start]] if start in parts else []) + [loose[s] for s in range(start, end)]
            write_parquet_atomic(directory / part_name(end), _merge(directory, inputs, end))
            superseded += inputs
        _remove([*superseded, *_stale_temps(directory)], directory)
    return end - start


def compact_session(root: Path | str, sid: str) -> int:
    """Compact one session's completions; returns how many per-completion files were merged."""
    return compact_dir(session_dir(Path(root), "completions", validate_session_id(sid)))


def compact_store(root: Path | str) -> dict[str, int]:
    """Compact every session of the store: {session_id: files merged} for sessions that changed."""
    merged = {}
    for directory in sorted(Path(root, "completions").glob("session_id=*")):
        sid = directory.name.removeprefix("session_id=")
        if count := compact_session(root, sid):
            merged[sid] = count
    return merged
