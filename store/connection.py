"""The DuckDB connection `store.connect` hands out: every statement reads the store as it is now.

Before every statement the connection brings its views to the store (`refresh`: what writers hold
uncommitted, each table's latest version; store/catalog.py). Removed Delta files stay until a vacuum
(store/maintenance.py) whose retention outlasts any statement, so a compaction never fails one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb


class StoreConnection:
    """A DuckDB connection over the store's views (`.duckdb`); other attributes are DuckDB's own.

    `sql()` returns its result already computed (an in-memory relation): it answers for the store as of its
    own refresh, not as of whenever it is consumed.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, refresh: Callable[[], None]) -> None:
        self.duckdb = con
        self.refresh = refresh

    def execute(self, query: str, parameters: object = None) -> duckdb.DuckDBPyConnection:
        """Run `query`; fetch its rows from the returned DuckDB connection, as with DuckDB."""
        self.refresh()
        return self.duckdb.execute(query, parameters)

    def sql(self, query: str, params: object = None) -> duckdb.DuckDBPyRelation | None:
        """DuckDB's `sql`, computed now (None for a statement without rows, as with DuckDB)."""
        self.refresh()
        relation = self.duckdb.sql(query, params=params)
        return None if relation is None else self.duckdb.from_arrow(relation.to_arrow_table())

    query = sql

    def __getattr__(self, name: str) -> object:
        return getattr(self.duckdb, name)

    def __enter__(self) -> StoreConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.duckdb.close()
