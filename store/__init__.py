"""The tracetap store: Parquet files partitioned by session, a durable writer, DuckDB/Polars readers.

`import store` stays cheap for the gateway: duckdb and polars load only when a reader is used.
"""

from store.catalog import connect, scan
from store.files import StoreError
from store.paths import InvalidSessionId, validate_session_id
from store.schema import SCHEMA_VERSION
from store.tables import write_session_table
from store.writer import StoreWriter

__all__ = [
    "SCHEMA_VERSION",
    "InvalidSessionId",
    "StoreError",
    "StoreWriter",
    "connect",
    "scan",
    "validate_session_id",
    "write_session_table",
]
