"""Durable file I/O: every Parquet file of the store is written and read through here.

A file only ever appears under its final name complete and fsync'd: it is written to a hidden temp
name in the same directory (`.<name>.<random>.tmp`, which no reader glob matches), flushed, fsync'd,
renamed over the final name, and the directory is fsync'd so the rename survives a crash.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
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


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(directory: Path) -> None:
    """mkdir -p, fsync'ing each parent that gained an entry so the new directory is durable."""
    if directory.is_dir():
        return
    ensure_dir(directory.parent)
    try:
        directory.mkdir()
    except FileExistsError:
        return
    fsync_dir(directory.parent)


def _write_atomic(path: Path, write) -> None:
    ensure_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_parquet_atomic(path: Path, table: pa.Table, compression: str = "snappy") -> None:
    """Write `table` to `path` so readers see either nothing or the whole, durable file."""

    def write(handle) -> None:
        # most files hold one row: no dictionaries, statistics only where readers prune on them
        pq.write_table(table, handle, use_dictionary=False, write_statistics=_stat_columns(table.schema),
                       row_group_size=ROW_GROUP_ROWS, compression=compression)

    _write_atomic(Path(path), write)


def write_text_atomic(path: Path, text: str) -> None:
    _write_atomic(Path(path), lambda handle: handle.write(text.encode()))


def read_parquet(paths: Sequence[str | Path], schema: pa.Schema, columns: list[str] | None = None) -> pa.Table:
    """Read complete files into one table with the store schema (an empty table when no paths)."""
    target = storage_schema(schema)
    if columns is not None:
        target = pa.schema([target.field(name) for name in columns])
    tables = [_read_one(Path(path), target) for path in paths]
    return pa.concat_tables(tables) if tables else target.empty_table()


def _read_one(path: Path, target: pa.Schema) -> pa.Table:
    """A file that already stores the wanted columns with the store's types is read directly, on this
    thread (~1 ms a file cheaper than pq.read_table's dataset layer); an older layout is filled and cast."""
    with pq.ParquetFile(path) as handle:
        stored = handle.schema_arrow
        if all(stored.get_field_index(f.name) >= 0 and stored.field(f.name).type == f.type for f in target):
            table = handle.read(columns=target.names, use_threads=False).select(target.names)
            return pa.Table.from_arrays(table.columns, schema=target)
    return pq.read_table(path, columns=target.names, schema=target)


def read_version(root: Path) -> int | None:
    """The store's schema version (None when VERSION is missing); a newer one than ours is an error."""
    try:
        version = int(Path(root, VERSION_FILE).read_text().strip())
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise StoreError(f"{root}/{VERSION_FILE} is not a schema version number") from error
    if version > SCHEMA_VERSION:
        raise StoreError(f"store {root} has schema version {version}; this tracetap knows {SCHEMA_VERSION}")
    return version


def check_store(root: Path | str) -> Path:
    """The store at `root`, or a StoreError saying why it cannot be read."""
    root = Path(root)
    if not root.is_dir():
        raise StoreError(f"store {root} does not exist")
    if read_version(root) is None:
        raise StoreError(f"{root} is not a tracetap store (no {VERSION_FILE} file)")
    return root
