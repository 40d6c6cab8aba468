"""Read the store: DuckDB views for SQL, Polars LazyFrames for notebooks; no data is copied.

Every table is a Delta table (store/delta.py). Before every statement the connection reads what writers
hold uncommitted (their logs' rows, their live session rows: store/reading.py says why first), then brings
each table to its latest version, registering its Arrow dataset with DuckDB again only when a commit came
since (making one costs ~0.8 ms a file). The completions view adds the log rows past what the registered
version holds; the sessions view picks each session's row of highest revision (store/live_sessions.py).
Tables not written yet are empty views with the schema's columns and types. A connection may be limited
to some sessions (`session_ids`): its statements then read only their partitions, whatever the store's
size. Completions files and log lines hold the compact form (store/compact_form.py): the view expands it in
SQL (`_expanded`), and the Polars scan of completions goes through the Python reader (store/reading.py), so
both show `prompt_token_ids`, `request_json` and `chat_request_json` whole. Views have no defined row
order: use ORDER BY session_id, seq. Nothing is retried: a compaction or a vacuum never fails a statement.

A connection `as_of` a past moment (store/time_travel.py) registers each table at the version the moment
resolves to once, with no uncommitted rows (the log and the live files are not versioned), and its
statements all read those versions.

The completions view also carries each call's thread (VIEW_COLUMNS): its `chain_index`, read from the
`prefix_merging` trajectories when they are built (the chain of the trace that holds the call, or
whose turn it retried), and `side_call`, true for a call offering no tools in a session whose other
calls do (a title, a summary, a compaction). The store imports no builder: this is a read-only join.

Stored JSON may hold lone surrogates (a harness may send `"\\ud800"`; the gateway keeps the escape),
which DuckDB's JSON parser refuses, failing the whole statement. SQL over stored JSON (these views,
queries/, the CLI) therefore parses `parseable_json(text)`, a macro of every connection: the text
itself, or with its lone surrogate escapes made U+FFFD (only that row's odd strings change), or NULL
when it is no JSON at all. One row never fails a statement.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from tracetap.store.compact_form import BODIES, PLACEHOLDER, refs_column, template_column
from tracetap.store.connection import StoreConnection
from tracetap.store.delta import DELTA_TABLES, committed_seqs, dataset, open_table
from tracetap.store.delta import read as read_delta
from tracetap.store.files import storage_schema
from tracetap.store.live_sessions import read_live
from tracetap.store.location import ObjectPath, StorePath, is_dir, store_path
from tracetap.store.log_reading import log_rows
from tracetap.store.paths import validate_session_id
from tracetap.store.reading import read_completions, read_sessions, uncommitted
from tracetap.store.schema import STORED_TABLES, TABLES
from tracetap.store.time_travel import AsOf

if TYPE_CHECKING:
    import duckdb
    import polars
    import pyarrow as pa
    from deltalake import DeltaTable

THREAD_BUILDER = "prefix_merging"
VIEW_COLUMNS = {"completions": (
    ("chain_index", "int32", f"chain of the call in the `{THREAD_BUILDER}` traces (null until built)"),
    ("side_call", "bool", "the request offers no tools while other calls of the session do (a title, "
                          "a summary, a compaction); null without a chat request"),
)}
UNCOMMITTED = {"completions": "tracetap_log", "sessions": "tracetap_live"}  # what writers hold, registered
_SURROGATE_ESCAPE = r"'\\u[dD][89a-fA-F][0-9a-fA-F]{2}'"  # RE2 for a surrogate's \uXXXX escape
_SURROGATES_REPLACED = f"regexp_replace(text, {_SURROGATE_ESCAPE}, '\\\\ufffd', 'g')"
# valid text is kept as it is (at the cost of one more parse); only text DuckDB refuses is rewritten
PARSEABLE_JSON = f"""CREATE MACRO parseable_json(text) AS CASE WHEN json_valid(text) THEN text
    WHEN json_valid({_SURROGATES_REPLACED}) THEN {_SURROGATES_REPLACED} END"""


def sql_string(value: str) -> str:
    """`value` as an SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def _typed_empty(con: duckdb.DuckDBPyConnection, table: str) -> str:
    """A SELECT with every stored column of `table`, typed, returning no rows."""
    empty = con.from_arrow(storage_schema(STORED_TABLES[table]).empty_table())
    return "SELECT " + ", ".join(f'NULL::{kind} AS "{name}"' for name, kind in
                                 zip(empty.columns, empty.types, strict=True)) + " WHERE false"


def _registered(table: str) -> str:
    return f"tracetap_delta_{table}"


def _source(con: duckdb.DuckDBPyConnection, table: str, empty: frozenset[str]) -> str:
    """`table`'s stored rows: its typed empty select, plus the registered version unless it has none (limited
    to the shown sessions), plus what writers hold uncommitted (completions, sessions)."""
    union = [_typed_empty(con, table)]
    if table not in empty:
        shown = "getvariable('tracetap_shown_sessions')"
        only_shown = "" if table == "rollouts" else f" WHERE {shown} IS NULL OR list_contains({shown}, session_id)"
        union.append(f"SELECT * FROM {_registered(table)}{only_shown}")
    if table in UNCOMMITTED:
        union.append(f"SELECT * FROM {UNCOMMITTED[table]}")
    return " UNION ALL BY NAME ".join(f"SELECT * FROM ({select})" for select in union)


def _columns(table: str, tables: dict = TABLES) -> str:
    return ", ".join(f'"{name}"' for name in tables[table].names)


def _body_texts(body: str) -> str:
    """(session_id, seq, texts): the texts of one JSON body's chunks, in template order."""
    refs = refs_column(body)
    items = f"SELECT session_id, seq, unnest({refs}) AS key, generate_subscripts({refs}, 1) AS ord FROM visible"
    return (f"SELECT i.session_id, i.seq, list(b.text ORDER BY i.ord) AS texts FROM ({items}) i "
            "JOIN blobs b ON i.session_id = b.session_id AND i.key = b.key GROUP BY ALL")


def _full_body(body: str) -> str:
    """The body whole: its template with chunk i put in place of the i-th PLACEHOLDER."""
    template = f"v.{template_column(body)}"
    parts = (f"list_transform(string_split({template}, chr({ord(PLACEHOLDER)})), "
             f"lambda literal, i: CASE WHEN i = 1 THEN literal ELSE {body}_t.texts[i - 1] || literal END)")
    return f"CASE WHEN {template} IS NULL THEN v.{body} ELSE array_to_string({parts}, '') END AS {body}"


def _expanded(visible: str) -> str:
    """Stored rows to full ones (store/compact_form.py): a recursive CTE follows prompt_ref_seq down each
    chain, one level per iteration; JSON bodies join their chunks by key (no recursion: chunks are
    content-addressed per session)."""
    step = ("list_concat(list_slice(list_concat(p.ids, coalesce(p.tail, [])), 1, v.prompt_ref_len), "
            "v.prompt_suffix_ids)")
    prompts = ("SELECT session_id, seq, coalesce(prompt_suffix_ids, prompt_token_ids) AS ids, "
               "completion_token_ids AS tail FROM visible WHERE prompt_ref_seq IS NULL UNION ALL "
               f"SELECT v.session_id, v.seq, {step}, v.completion_token_ids FROM visible v "
               "JOIN prompts p ON v.session_id = p.session_id AND v.prompt_ref_seq = p.seq")
    blobs = ("SELECT session_id, b.key AS key, any_value(b.text) AS text "
             "FROM (SELECT session_id, unnest(json_blobs) AS b FROM visible) GROUP BY ALL")
    texts = "".join(f", {body}_t AS ({_body_texts(body)})" for body in BODIES)
    joins = "".join(f" LEFT JOIN {body}_t ON v.session_id = {body}_t.session_id AND v.seq = {body}_t.seq"
                    for body in BODIES)
    full = ", ".join(_full_body(body) for body in BODIES)
    return (f"WITH RECURSIVE visible AS MATERIALIZED ({visible}), prompts(session_id, seq, ids, tail) AS "
            f"({prompts}), blobs AS ({blobs}){texts} "
            f"SELECT v.* EXCLUDE (prompt_token_ids, {', '.join(BODIES)}), p.ids AS prompt_token_ids, {full} "
            "FROM visible v LEFT JOIN prompts p ON v.session_id = p.session_id AND v.seq = p.seq" + joins)


def _threads(con: duckdb.DuckDBPyConnection, empty: frozenset[str]) -> str:
    """(session_id, completion_id, chain_index) for every call a thread-building trace holds or retried."""
    ids = "json_extract_string(parseable_json(metadata_json), '$.trace.retried_completion_ids[*]')"
    retried = f"CAST({ids} AS VARCHAR[])"
    calls = (f"SELECT session_id, chain_index, unnest(list_concat(completion_ids, coalesce({retried}, []))) "
             f"AS completion_id FROM ({_source(con, 'trajectories', empty)}) "
             f"WHERE builder = {sql_string(THREAD_BUILDER)}")
    return f"SELECT session_id, completion_id, min(chain_index) AS chain_index FROM ({calls}) GROUP BY ALL"


def _offering_tools(expanded: str) -> str:
    """`expanded` with `_tools`: does the chat request offer tools (NULL without a readable one)?"""
    offers = "CASE WHEN _request IS NULL THEN NULL ELSE coalesce(json_array_length(_request, '$.tools') > 0, false) END"
    request = f"SELECT *, parseable_json(chat_request_json) AS _request FROM ({expanded})"
    return f"SELECT * EXCLUDE (_request), {offers} AS _tools FROM ({request})"


def _completions_sql(con: duckdb.DuckDBPyConnection, empty: frozenset[str]) -> str:
    stored = f"SELECT {_columns('completions', STORED_TABLES)} FROM ({_source(con, 'completions', empty)})"
    with_tools = _offering_tools(_expanded(stored))
    return (f"SELECT c.{_columns('completions').replace(', ', ', c.')}, t.chain_index::INTEGER AS chain_index, "
            "NOT c._tools AND bool_or(c._tools) OVER (PARTITION BY c.session_id) AS side_call "
            f"FROM ({with_tools}) c LEFT JOIN ({_threads(con, empty)}) t "
            "ON c.session_id = t.session_id AND c.completion_id = t.completion_id")


def _view_sql(con: duckdb.DuckDBPyConnection, table: str, empty: frozenset[str]) -> str:
    if table == "completions":
        return _completions_sql(con, empty)
    current = (" QUALIFY row_number() OVER (PARTITION BY session_id ORDER BY coalesce(revision, 0) DESC) = 1"
               if table == "sessions" else "")
    return f"SELECT {_columns(table)} FROM ({_source(con, table, empty)}){current}"


class _Views:
    """One connection's views, brought before every statement to what writers hold now and to each table's
    latest version. A view over a table without a commit yet has no dataset to read: the views are made
    again whenever the set of such tables changes."""

    def __init__(self, con: duckdb.DuckDBPyConnection, root: StorePath, session_ids: list[str] | None,
                 as_of: AsOf | None = None) -> None:
        self.con, self.root, self.session_ids = con, root, session_ids
        # each table's version as of a moment (None: its latest, and what writers hold)
        self.pins = None if as_of is None else as_of.resolve(root)
        self.empty: frozenset[str] | None = None  # the tables without a commit the views were made for
        self.deltas: dict[str, DeltaTable] = {}  # each Delta table as last registered, by name
        self.registered: dict[str, int] = {}  # the version of each registered one
        self.covered: dict[str, int] = {}  # calls per session in the registered completions version

    def _delta(self, table: str) -> DeltaTable | None:
        """`table` at its latest version, registered for the views (its dataset made again only when a
        commit came since); None before its first commit."""
        delta = self.deltas.get(table)
        if delta is None and (self.pins is None or self.pins[table] is not None):
            delta = open_table(self.root, table, None if self.pins is None else self.pins[table])
        elif delta is not None and self.pins is None:
            delta.update_incremental()
        if delta is not None and self.registered.get(table) != delta.version():
            self.con.register(_registered(table), dataset(delta, table, self.session_ids))
            self.deltas[table], self.registered[table] = delta, delta.version()
            if table == "completions":
                self.covered = committed_seqs(delta, self.session_ids)
        return delta

    def _uncommitted(self) -> tuple[pa.Table, pa.Table]:
        """(log rows, live session rows) of the shown sessions; none as of a moment (they are not versioned)."""
        if self.pins is not None:
            return read_delta(None, "completions"), read_delta(None, "sessions")
        return log_rows(self.root, session_ids=self.session_ids), read_live(self.root, self.session_ids)

    def refresh(self) -> None:
        if self.pins is not None and self.empty is not None:
            return  # as of a moment: the versions registered first are all it ever reads
        # a statement first: it ends whatever result the last one left unfetched, which a register would refuse
        self.con.execute("SET VARIABLE tracetap_shown_sessions = $1::VARCHAR[]", [self.session_ids])
        logged, live = self._uncommitted()  # before the tables: store/reading.py
        versions = {table: self._delta(table) for table in DELTA_TABLES}
        self.con.register(UNCOMMITTED["completions"], uncommitted(logged, self.covered))
        self.con.register(UNCOMMITTED["sessions"], live)
        empty = frozenset(table for table, delta in versions.items() if delta is None)
        if empty != self.empty:
            self.con.execute("; ".join(f"CREATE OR REPLACE VIEW {table} AS {_view_sql(self.con, table, empty)}"
                                       for table in TABLES))
            self.empty = empty


def connect(root: StorePath | str, decode: Callable[[list[int]], str] | None = None,
            session_ids: Collection[str] | None = None, as_of: AsOf | None = None) -> StoreConnection:
    """An in-memory DuckDB connection with views `completions, sessions, rewards, trajectories`.

    With `decode`, the SQL function `decode(ids INTEGER[]) -> VARCHAR` calls it (NULL for NULL).
    Every connection has the macro `parseable_json(text)` (see the module docstring).
    With `session_ids`, the views hold those sessions only (and list nothing else).
    With `as_of`, the views show the committed rows of that moment (an AsOfError for one the store lacks).
    On an object store DuckDB reads the files through the store's fsspec filesystem (registered on the
    connection; the views list URLs of its protocol).
    """
    import duckdb

    root = store_path(root)
    if not is_dir(root):
        raise FileNotFoundError(f"store {root} does not exist")
    wanted = None if session_ids is None else [validate_session_id(sid) for sid in session_ids]
    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")  # the store's timestamps are UTC; show them so
    # Session, reward and trajectory files are replaced under the same name (temp + rename): a block cache
    # keyed by path could hand a reader pieces of the file it replaced.
    con.execute("SET enable_external_file_cache = false")
    con.execute(PARSEABLE_JSON)
    if isinstance(root, ObjectPath):
        con.register_filesystem(root.fs)
    views = _Views(con, root if isinstance(root, ObjectPath) else root.resolve(), wanted, as_of)
    views.refresh()
    if decode is not None:
        con.create_function("decode", lambda ids: decode(list(ids)), ["INTEGER[]"], "VARCHAR")
    return StoreConnection(con, views.refresh)


def scan(root: StorePath | str, table: str) -> polars.LazyFrame:
    """`table` as a Polars LazyFrame; its files are listed each time it is collected."""
    import polars
    from polars.io.plugins import register_io_source

    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
    schema = polars.DataFrame(storage_schema(TABLES[table]).empty_table()).schema

    def source(with_columns: list[str] | None, predicate: polars.Expr | None, n_rows: int | None,
               batch_size: int | None):
        yield _collect(store_path(root), table, schema, with_columns, predicate, n_rows)

    return register_io_source(source, schema=schema, explain_name=f"tracetap {table}")


def _completions_frame(root: StorePath, schema: polars.Schema, with_columns: list[str] | None,
                       predicate: polars.Expr | None) -> polars.LazyFrame:
    """Completions through the Python reader (store/reading.py), which expands the compact form."""
    import polars

    wanted = list(schema) if with_columns is None else list(with_columns)
    if predicate is not None:
        wanted += [name for name in predicate.meta.root_names() if name not in wanted]
    frames = [polars.DataFrame(table) for table in read_completions(root, None, wanted).values()]
    return polars.concat(frames).lazy() if frames else polars.LazyFrame(schema={n: schema[n] for n in wanted})


def _collect(root: StorePath, table: str, schema: polars.Schema, with_columns: list[str] | None,
             predicate: polars.Expr | None, n_rows: int | None) -> polars.DataFrame:
    """What one collect of `scan(root, table)` asks for, read from the files listed now."""

    if table == "completions":
        frame = _completions_frame(root, schema, with_columns, predicate)
    else:
        frame = _table_frame(root, table)
    if predicate is not None:
        frame = frame.filter(predicate)
    if with_columns is not None:
        frame = frame.select(with_columns)
    return (frame if n_rows is None else frame.head(n_rows)).collect()


def _table_frame(root: StorePath, table: str) -> polars.LazyFrame:
    """A table other than completions, read at its latest version (sessions: with the writers' live rows)."""
    import polars

    rows = read_sessions(root) if table == "sessions" else read_delta(open_table(root, table), table)
    return polars.DataFrame(rows.select(TABLES[table].names)).lazy()
