"""The Python read of completions and sessions: what is committed, plus what writers hold uncommitted.

A call is in a writer's log (store/commit_log.py) from its acknowledgement until a compaction commits
it to the `completions` Delta table; then the writer deletes the log segment. So a read takes the log
first and the table after: a segment deleted in between had its rows committed before, in the version
the read then loads. Of a session's log rows it shows those past what that version holds (seq >= N, the
table holding seqs 0..N-1). Session rows work the same way with the writers' live files
(store/live_sessions.py). Nothing is retried: a compaction or a vacuum never fails a read.

A read pinned to a version (`as_of`: time travel, store/time_travel.py) reads that version alone, without the
log or the live files: they are not versioned.
Completions come back expanded from the compact form (store/expansion.py), in seq order.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from tracetap.store.delta import latest_table, open_table
from tracetap.store.delta import read as read_delta
from tracetap.store.expansion import expand, inputs
from tracetap.store.live_sessions import current, read_live
from tracetap.store.location import StorePath, store_path
from tracetap.store.log_reading import log_rows
from tracetap.store.schema import COMPLETIONS

if TYPE_CHECKING:
    from deltalake import DeltaTable


def _of(session_ids: list[str] | None) -> pc.Expression | None:
    return None if session_ids is None else pc.field("session_id").isin(session_ids)


def _split(table: pa.Table) -> dict[str, pa.Table]:
    """Rows by session, each in seq order, sessions sorted."""
    table = table.sort_by([("session_id", "ascending"), ("seq", "ascending")])
    sids = table.column("session_id").to_pylist()
    runs: dict[str, pa.Table] = {}
    start = 0
    for end in range(1, len(sids) + 1):
        if end == len(sids) or sids[end] != sids[start]:
            runs[sids[start]] = table.slice(start, end - start)
            start = end
    return runs


def uncommitted(logged: pa.Table, covered: dict[str, int]) -> pa.Table:
    """The log rows past what a version of the table holds of their session (`covered`: calls per session)."""
    keep = [seq >= covered.get(sid, 0) for sid, seq in zip(logged.column("session_id").to_pylist(),
                                                             logged.column("seq").to_pylist(), strict=True)]
    return logged.filter(pa.array(keep, pa.bool_()))


def _covered(committed: pa.Table) -> dict[str, int]:
    """Calls per session in committed rows (seqs 0..N-1: N rows)."""
    held = committed.group_by("session_id").aggregate([("seq", "count")])
    return dict(zip(held.column(0).to_pylist(), held.column(1).to_pylist(), strict=True))


def _note(loaded: dict[str, int | None] | None, table: str, delta: DeltaTable | None) -> None:
    """Put the version a read loaded into `loaded` (when the caller keeps account: StoreReader.versions)."""
    if loaded is not None:
        loaded[table] = None if delta is None else delta.version()


def _table(root: StorePath, table: str, as_of: int | None, opened: dict[str, DeltaTable] | None) -> DeltaTable | None:
    """The version of `table` a read reads: `as_of`, else the latest (kept open in `opened`, when given)."""
    return open_table(root, table, as_of) if as_of is not None else latest_table(root, table, opened)


def stored_completions(root: StorePath | str, session_ids: list[str] | None, columns: list[str],
                       as_of: int | None = None, loaded: dict[str, int | None] | None = None,
                       opened: dict[str, DeltaTable] | None = None) -> pa.Table:
    """The stored (compact) rows of `columns` (session_id and seq always among them) of `session_ids`
    (all when None): the table's version, plus the log rows past it unless `as_of` pins a version.
    `loaded`, when given, gets the version read (under "completions"); `opened`: see delta.latest_table."""
    root = store_path(root)
    keys = list(dict.fromkeys(["session_id", "seq", *columns]))
    logged = log_rows(root, columns=keys, session_ids=session_ids) if as_of is None else None
    delta = _table(root, "completions", as_of, opened)
    _note(loaded, "completions", delta)
    committed = read_delta(delta, "completions", _of(session_ids), keys, session_ids)
    return committed if logged is None else pa.concat_tables([committed, uncommitted(logged, _covered(committed))])


def no_completions(columns: list[str] | None = None) -> pa.Table:
    """An empty table of full completions rows of `columns` (all by default): a session without rows."""
    wanted = columns if columns is not None else COMPLETIONS.names
    return expand(read_delta(None, "completions", columns=list(dict.fromkeys(["session_id", "seq", *inputs(wanted)]))),
                  wanted)


def read_completions(root: StorePath | str, session_ids: Collection[str] | None = None,
                     columns: list[str] | None = None, as_of: int | None = None,
                     loaded: dict[str, int | None] | None = None,
                     opened: dict[str, DeltaTable] | None = None) -> dict[str, pa.Table]:
    """Full completions rows in seq order, by session (every session with rows when `session_ids` is
    None; a named session without rows gets an empty table). `columns` may name compact ones.
    `loaded`, when given, gets the version of the table read (under "completions"); `opened`: see
    delta.latest_table."""
    wanted = columns if columns is not None else COMPLETIONS.names
    ids = None if session_ids is None else list(session_ids)
    runs = _split(stored_completions(root, ids, inputs(wanted), as_of, loaded, opened))
    named = runs.keys() if ids is None else ids
    empty = no_completions(wanted) if any(sid not in runs for sid in named) else None
    return {sid: expand(runs[sid], wanted) if sid in runs else empty for sid in named}


def read_sessions(root: StorePath | str, session_ids: Collection[str] | None = None,
                  as_of: int | None = None, loaded: dict[str, int | None] | None = None,
                  opened: dict[str, DeltaTable] | None = None) -> pa.Table:
    """Session rows (all, or those of `session_ids` that have one), by session id: the current one of
    each session's copies (store/live_sessions.py), or those of version `as_of` alone. `loaded`, when
    given, gets the version of the table read (under "sessions"); `opened`: see delta.latest_table."""
    ids = None if session_ids is None else list(session_ids)
    live = read_live(root, ids) if as_of is None else None
    delta = _table(store_path(root), "sessions", as_of, opened)
    _note(loaded, "sessions", delta)
    committed = read_delta(delta, "sessions", _of(ids))
    return current(committed if live is None else pa.concat_tables([committed, live]))
