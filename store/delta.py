"""The store's Delta Lake tables (deltalake): where each lives, how it is written, read at one version.

Delta gives what a store shared by many writers needs of a table format, so tracetap does not carry its
own: atomic commits from several processes (on the local disk, and on S3 with conditional PUTs), reads
of one committed version, time travel, a history of what wrote each version, and vacuum. Any engine
that reads Delta reads these tables (Polars `scan_delta`, deltalake, DuckDB through Arrow, Spark).

Writers replace rows by key in one commit (a predicate overwrite: a builder's traces of some sessions,
an evaluator's rewards of some sessions, one task's record), so writers of different keys never undo
each other's rows: a commit that raced another writer's is refused by deltalake and run again here.
Every commit names its writer in its metadata (`tracetap.writer`), which `tracetap history` shows.
"""

from __future__ import annotations

import functools
import json
import operator
import os
import random
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
from tracetap.store import files
from tracetap.store.files import StoreError, outdated, read_version
from tracetap.store.location import ObjectPath, StorePath, store_path
from tracetap.store.paths import SESSION_ID_PATTERN
from tracetap.store.schema import SCHEMA_VERSION, STORED_TABLES

if TYPE_CHECKING:
    import pyarrow.dataset
    import pyarrow.fs
    from deltalake import DeltaTable, WriterProperties

# partition columns: completions keep the per-session layout readers prune by, and a rebuild of traces drops a
# session's files, never rewriting a file shared with other sessions (a build's commit of 8 sessions over
# 64-session files took ~240 ms, 30 ms a session)
DELTA_TABLES: dict[str, tuple[str, ...]] = {"completions": ("session_id",), "sessions": (), "rewards": (),
                                            "trajectories": ("builder", "session_id"), "rollouts": ()}
# every 10th commit writes a checkpoint: a writer opening the table replays at most 9 JSON commits (at Delta's
# default of 100, a commit cost 13 ms on a fresh table and ~60 ms 90 commits later; 17 ms with 10)
TABLE_CONFIGURATION = {"delta.checkpointInterval": "10"}
# the only columns whose statistics data files and commits keep: what readers prune by (partition columns
# need none). A column a table names must have them in its files: deltalake reads missing bounds of a
# named column as null ones, and pyarrow then skips every file a filter on it reads (file_properties).
STATS_COLUMNS: dict[str, tuple[str, ...]] = {"completions": ("seq",), "sessions": ("session_id",),
                                             "rewards": ("session_id",), "trajectories": (), "rollouts": ("task_id",)}
DELTA_PROTOCOLS = ("s3", "s3a", "gs", "az", "abfs", "abfss")  # object stores deltalake commits to
WRITER_KEY = "tracetap.writer"  # commit metadata naming what wrote a version (a command, a gateway)
READ_VERSIONS_KEY = "tracetap.read_versions"  # commit metadata: the table versions the written rows came from (JSON)
COMMIT_ATTEMPTS = 30  # a write racing others commits again on the new version, this many times at most
FIRST_BACKOFF, MAX_BACKOFF = 0.01, 1.0  # seconds: the random pause before a retry is at most this, doubled each time


def table_uri(root: StorePath | str, table: str) -> str:
    """Where `table` lives: a directory of the store, or its prefix on an object store."""
    if table not in DELTA_TABLES:
        raise ValueError(f"unknown Delta table {table!r}; tables: {', '.join(DELTA_TABLES)}")
    return str(store_path(root) / table)


UNCOMMITTED = {"completions": " Calls not yet compacted are in the writers' group-commit logs (`log/*.jsonl`).",
               "sessions": " Rows of sessions changed since their last commit are in the writers' live files "
                           "(`log/*.sessions.parquet`); the row with the highest `revision` is current."}


def table_layout(table: str) -> str:
    """How `table` is kept, in a sentence or two for the docs."""
    partitions = DELTA_TABLES[table]
    by = f", partitioned by {' and '.join(partitions)}" if partitions else ""
    return (f"A Delta table at `{table}/`{by}: every write is one commit; `tracetap history` lists them."
            + UNCOMMITTED.get(table, ""))


def storage_options(root: StorePath | str) -> dict[str, str] | None:
    """deltalake's options for an object store: commits by conditional PUT (S3 keeps two writers from
    taking one version), plain HTTP only for an http:// endpoint (a local test server). Credentials and
    the endpoint come from the environment (AWS_*), never from the store."""
    if not isinstance(store_path(root), ObjectPath):
        return None
    options = {"conditional_put": "etag"}
    if os.environ.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        options["AWS_ALLOW_HTTP"] = "true"
    return options


def configuration(table: str) -> dict[str, str]:
    """The Delta table properties `table` is created with."""
    columns = STATS_COLUMNS[table]
    stats = {"delta.dataSkippingStatsColumns": ",".join(columns)} if columns else {
        "delta.dataSkippingNumIndexedCols": "0"}
    return TABLE_CONFIGURATION | stats


def file_properties(table: str) -> WriterProperties:
    """How `table`'s data files are written: zstd without dictionaries, statistics of its STATS_COLUMNS only.
    Statistics of every column (the default) kept the bounds of each page of JSON text: a 50-turn session's
    file was 1.7x the size (benchmarks/store_size.py)."""
    from deltalake import ColumnProperties, WriterProperties

    kept = {name: ColumnProperties(dictionary_enabled=False, statistics_enabled="CHUNK")
            for name in STATS_COLUMNS[table]}
    others = ColumnProperties(dictionary_enabled=False, statistics_enabled="NONE")
    return WriterProperties(compression="ZSTD", compression_level=3, default_column_properties=others,
                            column_properties=kept)


def storage_schema(table: str) -> pa.Schema:
    return files.storage_schema(STORED_TABLES[table])


def open_table(root: StorePath | str, table: str, version: int | None = None) -> DeltaTable | None:
    """`table` at its latest version (or at `version`: time travel); None when it was never written."""
    from deltalake import DeltaTable

    uri, options = table_uri(root, table), storage_options(root)
    if not _supported(root) or not DeltaTable.is_deltatable(uri, options):
        return None
    return DeltaTable(uri, storage_options=options, version=version)


def latest_table(root: StorePath | str, table: str, opened: dict[str, DeltaTable] | None) -> DeltaTable | None:
    """`table` at its latest version (None when it was never written). `opened`, a caller's own (one
    thread's), keeps the table open between calls: bringing an open table up to date reads only the commits
    since (~0.6 ms at 2,000 sessions), where opening it reads its log from the last checkpoint (~12-20 ms)."""
    delta = None if opened is None else opened.get(table)
    if delta is not None:
        delta.update_incremental()
        return delta
    delta = open_table(root, table)
    if opened is not None and delta is not None:
        opened[table] = delta
    return delta


def _supported(root: StorePath | str) -> bool:
    """Whether deltalake can hold tables there: the local disk or an object store it commits to (not another
    fsspec filesystem, such as `memory://`)."""
    root = store_path(root)
    return not isinstance(root, ObjectPath) or root.protocol in DELTA_PROTOCOLS


def check_supported(root: StorePath | str) -> None:
    """Raise ValueError unless deltalake can hold the store's tables at `root`."""
    if not _supported(root):
        raise ValueError(f"{root} cannot hold Delta tables: use a local path or one of "
                         f"{', '.join(p + '://' for p in DELTA_PROTOCOLS)}")


def _ensure(root: StorePath, table: str, writer: str) -> None:
    """Create `table` empty when it does not exist yet (two writers racing to create it both succeed)."""
    from deltalake import CommitProperties, DeltaTable

    check_supported(root)
    uri, options = table_uri(root, table), storage_options(root)
    if DeltaTable.is_deltatable(uri, options):
        return
    version = read_version(root)
    if version is not None and version < SCHEMA_VERSION:  # its table is still a tree of files, which
        raise outdated(root, version)  # a Delta table beside it would split (migrate_tables.py)
    try:
        DeltaTable.create(uri, storage_schema(table), partition_by=list(DELTA_TABLES[table]) or None,
                          mode="ignore", storage_options=options, configuration=configuration(table),
                          commit_properties=CommitProperties(custom_metadata={WRITER_KEY: writer}))
    except Exception:
        if not DeltaTable.is_deltatable(uri, options):
            raise  # not the other writer's create winning: a real failure


def replace(root: StorePath | str, table: str, rows: pa.Table, where: str, writer: str,
            metadata: Mapping[str, str] | None = None) -> None:
    """One commit: the rows matching `where` (SQL over the table's columns) become `rows`, its metadata naming
    `writer` (and holding `metadata`: READ_VERSIONS_KEY, say). A commit that lost a race to another writer's
    (deltalake's CommitFailedError: it added files the predicate may match) is run again on the new
    version: replacing a key's rows is the same write whenever it lands."""
    from deltalake import CommitProperties, write_deltalake
    from deltalake.exceptions import CommitFailedError

    root = store_path(root)
    _ensure(root, table, writer)
    properties = CommitProperties(custom_metadata={**(metadata or {}), WRITER_KEY: writer})
    data = rows.cast(storage_schema(table))
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            write_deltalake(table_uri(root, table), data, mode="overwrite", predicate=where,
                            storage_options=storage_options(root), commit_properties=properties,
                            writer_properties=file_properties(table))
            return
        except CommitFailedError:
            if attempt == COMMIT_ATTEMPTS - 1:
                raise
            time.sleep(random.uniform(0, min(MAX_BACKOFF, FIRST_BACKOFF * 2**attempt)))  # writers spread out


def read_versions_metadata(versions: Mapping[str, int | None]) -> dict[str, str]:
    """Commit metadata recording the table versions a write's rows were made from (`tracetap history` shows it)."""
    return {READ_VERSIONS_KEY: json.dumps(dict(versions), sort_keys=True)}


def read(delta: DeltaTable | None, table: str, where: pc.Expression | None = None,
         columns: list[str] | None = None, session_ids: list[str] | None = None) -> pa.Table:
    """The rows of one version of `table` (matching `where`; all columns or `columns`; only `session_ids`'
    when given) with the store's types; none without a table."""
    target = storage_schema(table)
    if columns is not None:
        target = pa.schema([target.field(name) for name in columns])
    if delta is None or session_ids == []:
        return target.empty_table()
    try:
        return dataset(delta, table, session_ids).to_table(columns=target.names, filter=where).cast(target)
    except (OSError, pa.ArrowInvalid) as error:
        raise _unreadable(delta, error) from None


def _unreadable(delta: DeltaTable, error: Exception) -> OSError | StoreError:
    """What to say when a version's data could not be read: the first of its files that is missing (a
    FileNotFoundError: a vacuum removed it, or someone else did) or no readable Parquet, by its full path (a
    read names it relative to the table), else the error as it came."""
    import pyarrow.parquet as pq

    for uri in delta.file_uris():
        try:
            pq.read_metadata(uri)
        except FileNotFoundError:
            return FileNotFoundError(f"{uri}, a data file of {delta.table_uri} version {delta.version()}, is gone "
                                     "(`tracetap vacuum` removes the files of versions older than its retention)")
        except (OSError, pa.ArrowInvalid) as broken:
            return StoreError(f"{uri} is not a readable Parquet file: {broken}")
    return StoreError(f"{delta.table_uri} could not be read: {error}")


def dataset(delta: DeltaTable, table: str, session_ids: list[str] | None = None) -> pyarrow.dataset.Dataset:
    """One version of `table` as an Arrow dataset; of a table partitioned by session, only the files of
    `session_ids` when given (making a dataset costs ~0.8 ms a file: 1.6 s over 2,000 sessions' traces)."""
    if not session_ids or "session_id" not in DELTA_TABLES[table]:  # none: the caller filters rows
        return delta.to_pyarrow_dataset()
    return _partition_files(delta, table, session_ids)


def _partition_files(delta: DeltaTable, table: str, session_ids: list[str]) -> pyarrow.dataset.Dataset:
    """The files of `session_ids`' partitions, picked from the version's add actions, each with its partition
    values as its partition expression (the scan fills the partition columns from them): one session's rows
    in ~4 ms where deltalake's pruned dataset took ~13 ms, in a table of 3,000 files."""
    import pyarrow.dataset as ds

    actions = pa.table(delta.get_add_actions(flatten=True))
    actions = actions.filter(pc.is_in(actions.column("partition.session_id"), pa.array(session_ids, pa.string())))
    filesystem, base = _filesystem(delta.table_uri)
    paths = [f"{base}/{unquote(path)}" for path in actions.column("path").to_pylist()]
    names = DELTA_TABLES[table]
    values = zip(*(actions.column(f"partition.{name}").to_pylist() for name in names), strict=True)
    expressions = [functools.reduce(operator.and_, (pc.field(n) == v for n, v in zip(names, row, strict=True)))
                   for row in values]
    return ds.FileSystemDataset.from_paths(paths, schema=storage_schema(table), format=ds.ParquetFileFormat(),
                                           filesystem=filesystem, partitions=expressions)


def _filesystem(table_uri: str) -> tuple[pyarrow.fs.FileSystem, str]:
    """An Arrow filesystem for a table's files, and the table's path in it (fsspec's for an object store:
    its credentials come from the environment, as deltalake's do)."""
    import pyarrow.fs

    if table_uri.startswith("file://"):
        return pyarrow.fs.LocalFileSystem(), unquote(urlparse(table_uri).path).rstrip("/")
    location = store_path(table_uri.rstrip("/"))
    assert isinstance(location, ObjectPath)
    return pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(location.fs)), location.key


def committed_seqs(delta: DeltaTable | None, session_ids: Iterable[str] | None = None) -> dict[str, int]:
    """How many calls one version of completions holds per session (all sessions, or `session_ids`): one past
    the highest seq in the statistics of its files, no file read (compaction commits a session's seqs
    0, 1, 2, ... in order, so its rows are exactly seqs 0..N-1)."""
    if delta is None:
        return {}
    actions = pa.table(delta.get_add_actions(flatten=True))
    if not actions.num_rows:
        return {}
    sids = actions.column("partition.session_id")
    if session_ids is not None:
        actions = actions.filter(pc.is_in(sids, pa.array(list(session_ids), pa.string())))
    grouped = actions.group_by("partition.session_id").aggregate([("max.seq", "max")])
    return dict(zip(grouped.column(0).to_pylist(), (top + 1 for top in grouped.column(1).to_pylist()), strict=True))


def sql_in(column: str, values: Iterable[str]) -> str:
    """`column IN ('a', 'b')` for checked ids (they match SESSION_ID_PATTERN: no quote can occur)."""
    checked = []
    for value in values:
        if not SESSION_ID_PATTERN.fullmatch(value):
            raise ValueError(f"invalid id {value!r} in a table predicate")
        checked.append(f"'{value}'")
    return f"{column} IN ({', '.join(checked)})" if checked else "false"
