"""The store's reader API: what builders, exports, evaluators, replay, the viewer and the CLI read.

Every table is a Delta table (store/delta.py). Completions and sessions are read with what writers hold
uncommitted (store/reading.py), each read as of the moment it runs; rewards, trajectories and rollouts
at one version, pinned at a reader's first read of them. A reader made `as_of` a past moment
(store/time_travel.py) reads every table at the version it resolves to, committed rows only. Reads that
name sessions read only those sessions' partitions: a read of one session costs about the same in a store
of ten sessions or of ten thousand. Tables come back as Arrow tables (the token columns stay columnar);
small per-session rows (sessions, rewards, tasks) as dicts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from tracetap.store.catalog import connect
from tracetap.store.compaction import recorded_sessions
from tracetap.store.connection import StoreConnection
from tracetap.store.delta import DELTA_TABLES, committed_seqs, open_table
from tracetap.store.delta import read as read_delta
from tracetap.store.files import check_store
from tracetap.store.location import StorePath
from tracetap.store.log_reading import log_seqs
from tracetap.store.paths import SESSION_ID_PATTERN, validate_name, validate_session_id
from tracetap.store.reading import no_completions, read_completions, read_sessions
from tracetap.store.time_travel import AsOf

if TYPE_CHECKING:
    from deltalake import DeltaTable


def _ids(session_ids: Collection[str] | None) -> list[str] | None:
    return None if session_ids is None else [validate_session_id(sid) for sid in session_ids]


def _matching(column: str, value: str | None, session_ids: list[str] | None) -> pc.Expression | None:
    """Rows whose `column` is `value` (any, when None) of `session_ids` (all, when None)."""
    where = None if value is None else pc.field(column) == validate_name(value, column)
    if session_ids is not None:
        of_sessions = pc.field("session_id").isin(session_ids)
        where = of_sessions if where is None else where & of_sessions
    return where


class Reader(Protocol):
    """What builders, exports, evaluators, replay and the CLI read through: the contract StoreReader
    meets, so code outside store/ depends on these methods and not on how a store lays out its files."""

    root: StorePath

    def session_ids(self) -> list[str]: ...
    def completions(self, session_id: str, columns: list[str] | None = None) -> pa.Table: ...
    def completions_of(self, session_ids: Collection[str], columns: list[str] | None = None,
                       ) -> dict[str, pa.Table]: ...
    def sessions(self, session_ids: Collection[str] | None = None) -> list[dict]: ...
    def session(self, session_id: str) -> dict | None: ...
    def trajectories(self, builder: str, session_ids: Collection[str] | None = None) -> pa.Table: ...
    def trajectory_session_ids(self, builder: str) -> list[str]: ...
    def rewards(self, evaluator: str | None = None, session_ids: Collection[str] | None = None) -> list[dict]: ...
    def connect(self, decode: Callable[[list[int]], str] | None = None,
                session_ids: Collection[str] | None = None) -> StoreConnection: ...
    def recorded(self, session_id: str) -> bool: ...
    def versions(self, tables: Collection[str] | None = None) -> dict[str, int | None]: ...


class StoreReader:
    """Read-only access to one store (checked to be a tracetap store when made).

    A reader reads each Delta table (store/delta.py) at one version: the latest when it first reads the
    table, so everything it answers from that table is one snapshot, whatever writers commit meanwhile.
    With `as_of`, every table at the version that moment resolves to (resolved once, when the reader is
    made: an AsOfError then for a version the store does not have), without what writers hold uncommitted."""

    def __init__(self, root: StorePath | str, as_of: AsOf | None = None) -> None:
        self.root = check_store(root)
        self.as_of = None if as_of is None else as_of.pin(self.root)  # every table's version, resolved
        self._pins = None if self.as_of is None else self.as_of.resolve(self.root)
        self._pinned: dict[str, DeltaTable | None] = {}
        self._loaded: dict[str, int | None] = {}  # completions and sessions: the version the last read loaded
        self._threads = threading.local()  # each thread's open completions and sessions tables (_opened)

    def _version(self, table: str) -> DeltaTable | None:
        """The version of `table` this reader reads (None: the table has no commit yet, or had none then)."""
        if table not in self._pinned:
            self._pinned[table] = None if self._unwritten(table) else open_table(self.root, table, self._at(table))
        return self._pinned[table]

    def _opened(self) -> dict[str, DeltaTable]:
        """This thread's completions and sessions tables, kept open between live reads and brought up to date
        at each (delta.latest_table): a DeltaTable is not shared between threads."""
        if not hasattr(self._threads, "tables"):
            self._threads.tables = {}
        return self._threads.tables

    def versions(self, tables: Collection[str] | None = None) -> dict[str, int | None]:
        """The version this reader read of each Delta table (or of `tables`; None: no commit), what a dataset
        built from its answers needs to be rebuilt exactly (`as_of` those versions). As of a moment: the
        versions it resolved to. Otherwise completions and sessions, read live: the version their last read
        loaded (with what writers held uncommitted then, which no version holds); other tables: the pin,
        taken now for one not read yet."""
        if self._pins is not None:
            return {table: self._pins[table] for table in (DELTA_TABLES if tables is None else tables)}
        return {table: self._loaded[table] if table in self._loaded else
                None if (delta := self._version(table)) is None else delta.version()
                for table in (DELTA_TABLES if tables is None else tables)}

    def _at(self, table: str) -> int | None:
        """The version of `table` an as-of reader reads (None: the latest, or, as of a moment, no commit)."""
        return None if self._pins is None else self._pins[table]

    def _unwritten(self, table: str) -> bool:
        """Whether `table` had no commit at this reader's moment (it reads empty)."""
        return self._pins is not None and self._pins[table] is None

    def session_ids(self) -> list[str]:
        """Ids of the sessions with recorded completions, sorted."""
        if self._pins is None:
            return recorded_sessions(self.root)
        return sorted(sid for sid in committed_seqs(self._version("completions")) if SESSION_ID_PATTERN.fullmatch(sid))

    def files(self, table: str) -> list[str]:
        """The Parquet files of the version of `table` this reader reads, for tools that scan them directly
        (completions and sessions: committed rows only)."""
        delta = self._version(table)
        return [] if delta is None else delta.file_uris()

    def completions(self, session_id: str, columns: list[str] | None = None) -> pa.Table:
        """One session's completions in seq order (empty when it has none); all columns by default."""
        return self.completions_of([session_id], columns)[validate_session_id(session_id)]

    def completions_of(self, session_ids: Collection[str], columns: list[str] | None = None,
                       ) -> dict[str, pa.Table]:
        """Several sessions' completions from one listing: {session_id: its rows in seq order}."""
        if self._unwritten("completions"):
            return {sid: no_completions(columns) for sid in _ids(session_ids) or []}
        return read_completions(self.root, _ids(session_ids) or [], columns, self._at("completions"), self._loaded,
                                self._opened())

    def sessions(self, session_ids: Collection[str] | None = None) -> list[dict]:
        """Session rows (all, or those of `session_ids` that have one), by session id."""
        if self._unwritten("sessions"):
            return []
        return read_sessions(self.root, _ids(session_ids), self._at("sessions"), self._loaded,
                             self._opened()).to_pylist()

    def _delta(self, table: str, where: pc.Expression | None, columns: list[str] | None = None,
               session_ids: list[str] | None = None) -> pa.Table:
        """Rows of the version of a Delta table this reader reads (`session_ids`: its files of those only)."""
        return read_delta(self._version(table), table, where, columns, session_ids)

    def session(self, session_id: str) -> dict | None:
        """One session's row, or None when the store has none for it."""
        rows = self.sessions([session_id])
        return rows[0] if rows else None

    def trajectories(self, builder: str, session_ids: Collection[str] | None = None) -> pa.Table:
        """`builder`'s traces (all sessions, or `session_ids`), by session id then trace index."""
        wanted = _ids(session_ids)
        table = self._delta("trajectories", _matching("builder", builder, wanted), session_ids=wanted)
        return table.sort_by([("session_id", "ascending"), ("trace_index", "ascending")])

    def trajectory_session_ids(self, builder: str) -> list[str]:
        """Ids of the sessions with a trajectories file of `builder`, sorted."""
        table = self._delta("trajectories", _matching("builder", builder, None), ["session_id"])
        return sorted(set(table.column("session_id").to_pylist()))

    def rewards(self, evaluator: str | None = None, session_ids: Collection[str] | None = None) -> list[dict]:
        """Reward rows (of one evaluator, when given), by session id, creation time, evaluator."""
        table = self._delta("rewards", _matching("evaluator", evaluator, _ids(session_ids)))
        order = [("session_id", "ascending"), ("created_at", "ascending"), ("evaluator", "ascending")]
        return table.sort_by(order).to_pylist()

    def connect(self, decode: Callable[[list[int]], str] | None = None,
                session_ids: Collection[str] | None = None) -> StoreConnection:
        """A DuckDB connection over the store's views (see store/catalog.py `connect`), as of this reader's
        moment when it has one."""
        return connect(self.root, decode, session_ids, self.as_of)

    def recorded(self, session_id: str) -> bool:
        """Whether the store holds completions of this session; the log first (store/reading.py)."""
        sid = validate_session_id(session_id)
        if self._pins is not None:
            return sid in committed_seqs(self._version("completions"), [sid])
        return bool(log_seqs(self.root, sid)) or sid in committed_seqs(open_table(self.root, "completions"), [sid])

