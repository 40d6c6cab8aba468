"""The tracetap store: Parquet files partitioned by session, a durable writer, DuckDB/Polars readers.

`import store` stays cheap for the gateway: duckdb and polars load only when a reader is used.
"""

from tracetap.store.catalog import connect, scan
from tracetap.store.files import StoreError
from tracetap.store.migrate import Migration, migrate_store
from tracetap.store.paths import InvalidSessionId, validate_session_id
from tracetap.store.schema import SCHEMA_VERSION
from tracetap.store.tables import write_session_table
from tracetap.store.writer import StoreWriter

__all__ = [
    "SCHEMA_VERSION",
    "InvalidSessionId",
    "Migration",
    "StoreError",
    "StoreWriter",
    "connect",
    "migrate_store",
    "scan",
    "validate_session_id",
    "write_session_table",
]
