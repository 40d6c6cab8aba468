"""How every read survives a gateway appending to the store and compacting it meanwhile.

Compaction (store/compaction.py) renames a part file in, then deletes the files it merged, so a
reader may list a file that is gone when it opens it. Every read runs through `retrying`: a read
that lost a file it had listed starts over from a fresh listing (store/snapshot.py), so its answer
is the store as of one listing (no row twice, none missing), never a mix.

Completions are read here for every Python reader: the listed files and group-commit log rows of a
snapshot, the log rows filtered by the visibility rule, expanded from the compact form
(store/expansion.py) to full rows in seq order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import TypeVar

import pyarrow as pa
from tracetap.store.expansion import expand, inputs
from tracetap.store.files import read_parquet
from tracetap.store.location import StorePath, store_path
from tracetap.store.log_reading import log_rows
from tracetap.store.paths import session_of
from tracetap.store.schema import COMPLETIONS, STORED_COMPLETIONS
from tracetap.store.snapshot import Snapshot, snapshot

ATTEMPTS = 14
FIRST_BACKOFF = 0.002  # seconds before the second attempt, doubled for each next one (~16 s in all: a
# statement over the v2 views reads every listed file's schema, so a busy compaction can race several attempts)

T = TypeVar("T")


def file_vanished(error: BaseException) -> bool:
    """Whether `error` means a listed file was gone when opened, as a concurrent compaction causes."""
    return isinstance(error, FileNotFoundError)


def retrying(read: Callable[[], T], vanished: Callable[[BaseException], bool] = file_vanished) -> T:
    """`read()`, run again (from its own fresh listing) while it fails because a listed file vanished."""
    for attempt in range(ATTEMPTS - 1):
        try:
            return read()
        except Exception as error:
            if not vanished(error):
                raise
        time.sleep(FIRST_BACKOFF * 2**attempt)
    return read()


def _by_session(logged: pa.Table, covered: dict[str, int]) -> dict[str, list[int]]:
    """Indexes of the visible log rows (seq >= the session's covered N), by session."""
    rows: dict[str, list[int]] = {}
    sessions, seqs = logged.column("session_id").to_pylist(), logged.column("seq").to_pylist()
    for index, (sid, seq) in enumerate(zip(sessions, seqs, strict=True)):
        if seq >= covered.get(sid, 0):
            rows.setdefault(sid, []).append(index)
    return rows


def _stored(root: StorePath, listed: Snapshot, session_ids: Collection[str] | None,
            columns: list[str]) -> dict[str, pa.Table]:
    """Stored rows by session: each session's listed files, then its visible log rows."""
    keys = list(dict.fromkeys(["session_id", "seq", *columns]))  # the rule needs them, the caller may not
    logged = log_rows(root, columns=keys, segments=[store_path(path) for path in listed.log], session_ids=session_ids)
    in_log = _by_session(logged, listed.covered())
    logged = logged.select(columns)
    wanted = sorted(set(listed.completions) | set(in_log)) if session_ids is None else list(session_ids)
    files = {sid: list(listed.completions[sid].files) if sid in listed.completions else [] for sid in wanted}
    return {sid: _with_log(read_parquet(files[sid], STORED_COMPLETIONS, columns), logged, in_log.get(sid))
            for sid in wanted}


def _with_log(stored: pa.Table, logged: pa.Table, rows: list[int] | None) -> pa.Table:
    """A session's file rows, then its visible log rows (none: the file rows as they are)."""
    return pa.concat_tables([stored, logged.take(pa.array(rows, pa.int64()))]) if rows else stored


def read_completions(root: StorePath | str, session_ids: Collection[str] | None = None,
                     columns: list[str] | None = None) -> dict[str, pa.Table]:
    """Full completions rows in seq order, by session (every session with rows when `session_ids` is
    None), as of one snapshot, whatever compaction does meanwhile. `columns` may name compact ones."""
    wanted = columns if columns is not None else COMPLETIONS.names
    root = store_path(root)

    def read() -> dict[str, pa.Table]:
        return _stored(root, snapshot(root, ["completions"], session_ids), session_ids, inputs(wanted))

    return {sid: expand(table, wanted) for sid, table in retrying(read).items()}


def read_session(directory: StorePath | str, columns: list[str] | None = None) -> pa.Table:
    """One session's completions (its `completions/session_id=<sid>` directory), see read_completions."""
    root, sid = session_of(directory)
    return read_completions(root, [sid], columns)[sid]
