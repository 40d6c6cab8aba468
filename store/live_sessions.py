"""Session rows between their commits: each writer's live file, and the rule that picks a session's row.

A session's row changes with every call (counts, tokens, the last call's time); committing it to the
`sessions` Delta table each time would cost a commit per call. So a writer keeps the rows its sessions
changed since their last commit in one file of its own, `log/<writer-id>.sessions.parquet`, rewritten
whole (atomically) shortly after each change, and commits them to the table when it compacts those
sessions (store/compaction.py). Every copy of a row carries `revision`, which the session's writer bumps on
each change: of a session's committed row and any live ones, the one with the highest revision is current.
A writer commits a row before leaving it out of its live file, so a reader that reads the live files
first and the table after never misses a row.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from tracetap.store.files import read_parquet, write_parquet_atomic
from tracetap.store.location import StorePath, remove, store_path
from tracetap.store.paths import live_file, live_files
from tracetap.store.schema import SESSIONS
from tracetap.store.tables import rows_to_table


def write_live(root: StorePath, writer_id: str, rows: list[dict]) -> None:
    """Make `rows` the writer's live rows (none: its file goes)."""
    path = live_file(root, writer_id)
    if rows:
        write_parquet_atomic(path, rows_to_table("sessions", rows))
    else:
        remove(path)


def read_live(root: StorePath | str, session_ids: list[str] | None = None) -> pa.Table:
    """Every writer's live rows (of `session_ids`, when given); a file removed since it was listed counts
    as empty: its writer committed its rows first."""
    tables = []
    for path in live_files(store_path(root)):
        try:
            tables.append(read_parquet([path], SESSIONS))
        except FileNotFoundError:
            continue
    rows = pa.concat_tables(tables) if tables else read_parquet([], SESSIONS)
    if session_ids is not None:
        rows = rows.filter(pc.is_in(rows.column("session_id"), pa.array(session_ids, pa.string())))
    return rows


def current(rows: pa.Table) -> pa.Table:
    """Each session's row with the highest revision (of equal ones, the first), by session id."""
    if not rows.num_rows:
        return rows
    revision = pc.fill_null(rows.column("revision"), 0)
    ordered = rows.append_column("_revision", revision).append_column(
        "_index", pa.array(range(rows.num_rows), pa.int64()))
    ordered = ordered.sort_by([("session_id", "ascending"), ("_revision", "descending"), ("_index", "ascending")])
    sids = ordered.column("session_id")
    first = pc.invert(pc.fill_null(pc.equal(sids.slice(1), sids.slice(0, len(sids) - 1)), False))
    keep = pa.concat_arrays([pa.array([True]), first.combine_chunks()])
    return ordered.filter(keep).drop_columns(["_revision", "_index"])


def remove_committed(root: StorePath, committed: pa.Table) -> None:
    """Remove the live files whose every row `committed` (the sessions table's rows) holds at that revision or
    a later one: what a dead writer left. A live writer's file with a newer row stays (and a file of one that
    rewrote it since is rewritten again at its next change)."""
    revisions = pc.fill_null(committed.column("revision"), 0).to_pylist()
    held = dict(zip(committed.column("session_id").to_pylist(), revisions, strict=True))
    for path in live_files(root):
        try:
            rows = read_parquet([path], SESSIONS, ["session_id", "revision"])
        except FileNotFoundError:
            continue
        pairs = zip(rows.column("session_id").to_pylist(), rows.column("revision").to_pylist(), strict=True)
        if all((revision or 0) <= held.get(sid, -1) for sid, revision in pairs):
            remove(path)
