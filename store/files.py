"""Durable file I/O: every Parquet file of the store is written and read through here.

A file only ever appears under its final name complete and durable (store/location.py `write_atomic`):
on the local disk it is written to a hidden temp name in the same directory (`.<name>.<random>.tmp`,
which no reader glob matches), flushed, fsync'd, renamed over the final name, and the directory is
fsync'd so the rename survives a crash; on an object store it is one PUT.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq
from tracetap.store.location import (
    StorePath,
    is_dir,
    parquet_source,
    read_bytes,
    store_path,
    write_atomic,
    write_atomic_many,
)
from tracetap.store.paths import VERSION_FILE
from tracetap.store.schema import SCHEMA_VERSION

ROW_GROUP_ROWS = 1024


class StoreError(ValueError):
    """The directory is not a usable tracetap store."""


def storage_schema(schema: pa.Schema) -> pa.Schema:
    """The schema as written to files: column docs stripped (they live in schema.py, not per file)."""
    return pa.schema([field.remove_metadata() for field in schema])


def _stat_columns(schema: pa.Schema) -> list[str]:
    """Scalar columns other than JSON bodies: cheap min/max that let readers skip files."""
    return [f.name for f in schema if not f.name.endswith("_json") and not pa.types.is_nested(f.type)]


def write_parquet_atomic(path: StorePath, table: pa.Table, compression: str = "snappy") -> None:
    """Write `table` to `path` so readers see either nothing or the whole, durable file."""
    write_parquet_atomic_many([(path, table)], compression)


def write_parquet_atomic_many(files: Sequence[tuple[StorePath, pa.Table]], compression: str = "snappy") -> None:
    """write_parquet_atomic for several files, made durable together (store/location.py write_atomic_many)."""
    write_atomic_many([(store_path(path), partial(_write_parquet, table, compression)) for path, table in files])


def _write_parquet(table: pa.Table, compression: str, handle: IO[bytes]) -> None:
    # most files hold one row: no dictionaries, statistics only where readers prune on them
    pq.write_table(table, handle, use_dictionary=False, write_statistics=_stat_columns(table.schema),
                   row_group_size=ROW_GROUP_ROWS, compression=compression)


def write_text_atomic(path: StorePath, text: str) -> None:
    write_atomic(store_path(path), lambda handle: handle.write(text.encode()))


def read_parquet(paths: Sequence[str | StorePath], schema: pa.Schema, columns: list[str] | None = None) -> pa.Table:
    """Read complete files into one table with the store schema (an empty table when no paths)."""
    target = storage_schema(schema)
    if columns is not None:
        target = pa.schema([target.field(name) for name in columns])
    tables = [_read_one(path, target) for path in paths]
    return pa.concat_tables(tables) if tables else target.empty_table()


def _read_one(path: str | StorePath, target: pa.Schema) -> pa.Table:
    """One file as `target`; a damaged file is a StoreError naming it (a vanished one stays a
    FileNotFoundError, which readers retry from a fresh listing)."""
    try:
        return _read_file(path, target)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as error:
        raise StoreError(f"{path} is not a readable Parquet file: {error}") from None


def _read_file(path: str | StorePath, target: pa.Schema) -> pa.Table:
    """A file that already stores the wanted columns with the store's types is read directly, on this
    thread (~1 ms a file cheaper than pq.read_table's dataset layer); an older layout is filled and cast."""
    with parquet_source(path) as source:
        handle = pq.ParquetFile(source)
        stored = handle.schema_arrow
        if all(stored.get_field_index(f.name) >= 0 and stored.field(f.name).type == f.type for f in target):
            table = handle.read(columns=target.names, use_threads=False).select(target.names)
            return pa.Table.from_arrays(table.columns, schema=target)
        return pq.read_table(source, columns=target.names, schema=target)


def read_version(root: StorePath) -> int | None:
    """The store's schema version (None when VERSION is missing); a newer one than ours is an error."""
    try:
        version = int(read_bytes(store_path(root) / VERSION_FILE).decode().strip())
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise StoreError(f"{root}/{VERSION_FILE} is not a schema version number") from error
    if version > SCHEMA_VERSION:
        raise StoreError(f"store {root} has schema version {version}; this tracetap knows {SCHEMA_VERSION}")
    return version


def check_store(root: StorePath | str, *, older: bool = False) -> StorePath:
    """The store at `root` (a directory or an object store URL), or a StoreError saying why it cannot be read.

    A store of an older schema version is refused unless `older` (for `tracetap migrate`, which rewrites
    it): its tables are laid out otherwise, so a reader would miss or misread their rows."""
    root = store_path(root)
    if not is_dir(root):
        raise StoreError(f"store {root} does not exist")
    version = read_version(root)
    if version is None:
        raise StoreError(f"{root} is not a tracetap store (no {VERSION_FILE} file)")
    if version < SCHEMA_VERSION and not older:
        raise outdated(root, version)
    return root


def outdated(root: StorePath, version: int) -> StoreError:
    """The error readers and writers give for a store of an older schema version: how to bring it up to date."""
    return StoreError(f"store {root} has schema version {version}: run `tracetap migrate --store {root}` to "
                      f"rewrite it in version {SCHEMA_VERSION} before using it")
