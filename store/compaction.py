"""Compaction: calls move from the group-commit log into the `completions` Delta table, many sessions a commit.

A writer answers a call once its log line is durable (store/commit_log.py); the log is the hot path, the
table is where calls rest. A compaction takes, per session, the logged rows from the first seq the table
lacks (its statistics say how many it holds: store/delta.py `committed_seqs`) up to the first gap, and
commits them all at once as a predicate overwrite of exactly those (session, seq) ranges. Two compactions
of one session (its writer and `tracetap compact`, or a takeover) conflict in deltalake's check and the
loser runs again, replacing those rows by the same rows: each call is in the table once. Rows past a gap,
which a correct writer never leaves, stay in the log.

The log segments whose every row the table holds are deleted by their writer afterwards
(store/writer.py); readers read the log before the table (store/reading.py), so a segment deleted
meanwhile has its rows in the version they read.
"""

from __future__ import annotations

from collections.abc import Collection

import pyarrow as pa
import pyarrow.compute as pc
from tracetap.store.delta import committed_seqs, open_table, replace, sql_in, storage_schema
from tracetap.store.location import StorePath, store_path
from tracetap.store.log_reading import log_rows, logged_sessions
from tracetap.store.paths import SESSION_ID_PATTERN, validate_session_id

COMPACTOR = "tracetap compact"  # the writer `tracetap compact` commits as


def _run(rows: pa.Table, start: int) -> pa.Table:
    """The rows with seqs start, start+1, ... up to the first gap, in seq order."""
    rows = rows.filter(pc.field("seq") >= start).sort_by("seq")
    seqs = rows.column("seq").to_pylist()
    end = 0
    while end < len(seqs) and seqs[end] == start + end:
        end += 1
    return rows.slice(0, end)


def _ranges(runs: dict[str, pa.Table]) -> str:
    """The predicate naming exactly the (session, seq) ranges of `runs` (session ids are checked ids)."""
    return " OR ".join(f"(session_id = '{validate_session_id(sid)}' AND seq BETWEEN {run['seq'][0]} AND "
                       f"{run['seq'][-1]})" for sid, run in runs.items())


def commit_logged(root: StorePath | str, logged: pa.Table, writer: str,
                  covered: dict[str, int] | None = None) -> dict[str, int]:
    """Commit the logged rows (storage form, any sessions) the table lacks, in one commit; returns, for
    every session of `logged`, how many calls the table holds now. `covered`: how many calls the table
    holds per session, when the caller knows it from a version it keeps open (opening the table costs
    ~10 ms at 2,000 sessions); a stale count costs only work: the commit replaces those calls by themselves."""
    root = store_path(root)
    sids = sorted(set(logged.column("session_id").to_pylist()))
    if covered is None:
        covered = committed_seqs(open_table(root, "completions"), sids)
    runs = {}
    for sid in sids:
        run = _run(logged.filter(pc.field("session_id") == sid), covered.get(sid, 0))
        if run.num_rows:
            runs[sid] = run
    if runs:
        replace(root, "completions", pa.concat_tables(runs.values()), _ranges(runs), writer)
    return {sid: covered.get(sid, 0) + (runs[sid].num_rows if sid in runs else 0) for sid in sids}


def recorded_sessions(root: StorePath | str) -> list[str]:
    """Ids of the sessions with completions (rows in the log, or in the table), sorted. The log is read
    first: a segment deleted meanwhile had its rows committed before."""
    logged = logged_sessions(root)
    committed = committed_seqs(open_table(root, "completions"))
    return sorted(sid for sid in logged | committed.keys() if SESSION_ID_PATTERN.fullmatch(sid))


def compact_sessions(root: StorePath | str, session_ids: Collection[str] | None = None,
                     writer: str = COMPACTOR) -> dict[str, int]:
    """Commit the logged calls of `session_ids` (all logged sessions when None) the table lacks:
    {session: calls committed now} for sessions that had any. The log is left to its writers, who delete
    what the table holds (a live writer may still append to its segment)."""
    root = store_path(root)
    wanted = None if session_ids is None else [validate_session_id(sid) for sid in session_ids]
    logged = log_rows(root, session_ids=wanted)
    before = committed_seqs(open_table(root, "completions"), wanted)
    after = commit_logged(root, logged, writer) if logged.num_rows else {}
    return {sid: count - before.get(sid, 0) for sid, count in after.items() if count > before.get(sid, 0)}


def load_recorded(root: StorePath | str, completions: pa.Table, sessions: pa.Table, writer: str) -> None:
    """Commit calls recorded elsewhere (stored rows of another store's completions table, any sessions)
    that the table lacks, in one commit, then their sessions' rows in one more: how a store is assembled
    from stores filled in parallel (a local store takes one writer process at a time)."""
    root = store_path(root)
    commit_logged(root, completions.select(storage_schema("completions").names), writer)
    sids = sessions.column("session_id").to_pylist()
    replace(root, "sessions", sessions.select(storage_schema("sessions").names), sql_in("session_id", sids), writer)
