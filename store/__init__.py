"""The tracetap store: Delta tables partitioned by session, a durable writer, DuckDB/Polars readers.

This is the store's public surface: code outside `store/` imports from here only (a ruff rule,
TID251, bans its internal modules elsewhere). `import store` stays cheap for the gateway: duckdb and
polars load only when a reader is used.
"""

from tracetap.store.catalog import VIEW_COLUMNS, connect, scan
from tracetap.store.compaction import compact_sessions, load_recorded
from tracetap.store.connection import StoreConnection
from tracetap.store.delta import table_layout
from tracetap.store.files import StoreError, check_store, storage_schema, write_text_atomic
from tracetap.store.grants import Grant, find_secret, save_grant, secret_hash
from tracetap.store.location import (
    InvalidLocation,
    ObjectPath,
    StorePath,
    check_reachable,
    ensure_dir,
    fsync_dir,
    store_path,
)
from tracetap.store.maintenance import DEFAULT_RETAIN_HOURS, TableVersion, history, vacuum
from tracetap.store.migrate import Migration, migrate_store
from tracetap.store.owners import SessionOwned
from tracetap.store.paths import InvalidSessionId, validate_name, validate_session_id
from tracetap.store.prompts import Prompts, Stored
from tracetap.store.reader import Reader, StoreReader
from tracetap.store.schema import SCHEMA_VERSION, TABLES, describe, empty_row
from tracetap.store.tables import write_session_table, write_session_tables
from tracetap.store.tasks import read_task, read_tasks, save_task
from tracetap.store.time_travel import AsOf, AsOfError
from tracetap.store.time_travel import parse as parse_as_of
from tracetap.store.writer import StoreWriter

__all__ = [
    "AsOf",
    "AsOfError",
    "DEFAULT_RETAIN_HOURS",
    "SCHEMA_VERSION",
    "TABLES",
    "VIEW_COLUMNS",
    "Grant",
    "InvalidLocation",
    "InvalidSessionId",
    "Migration",
    "ObjectPath",
    "Prompts",
    "Reader",
    "SessionOwned",
    "StoreConnection",
    "StoreError",
    "StorePath",
    "StoreReader",
    "StoreWriter",
    "Stored",
    "TableVersion",
    "check_reachable",
    "check_store",
    "compact_sessions",
    "connect",
    "describe",
    "empty_row",
    "ensure_dir",
    "find_secret",
    "fsync_dir",
    "history",
    "load_recorded",
    "read_task",
    "migrate_store",
    "parse_as_of",
    "read_tasks",
    "save_grant",
    "save_task",
    "scan",
    "secret_hash",
    "storage_schema",
    "store_path",
    "table_layout",
    "validate_name",
    "validate_session_id",
    "vacuum",
    "write_session_table",
    "write_session_tables",
    "write_text_atomic",
]
