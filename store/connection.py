"""The DuckDB connection `store.connect` hands out: SQL that survives compaction under it.

DuckDB lists a view's files when a statement starts and opens them while it runs; a compaction in
between deletes some (store/reading.py). `execute` and `sql` then run the statement again: views
list their files afresh, and a failed statement left nothing behind (DuckDB rolls it back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracetap.store.reading import retrying

if TYPE_CHECKING:
    import duckdb

VANISHED_MESSAGES = ("No such file or directory", "No files found that match the pattern")


def duckdb_vanished(error: BaseException) -> bool:
    """Whether DuckDB failed because a file it had listed was gone when it opened it."""
    import duckdb

    return isinstance(error, duckdb.IOException) and any(text in str(error) for text in VANISHED_MESSAGES)


class StoreConnection:
    """A DuckDB connection over the store's views (`.duckdb`); other attributes are DuckDB's own.

    `sql()` returns its result already computed (an in-memory relation), so the retry covers it too.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.duckdb = con

    def execute(self, query: str, parameters: object = None) -> duckdb.DuckDBPyConnection:
        """Run `query`; fetch its rows from the returned DuckDB connection, as with DuckDB."""
        return retrying(lambda: self.duckdb.execute(query, parameters), duckdb_vanished)

    def sql(self, query: str, params: object = None) -> duckdb.DuckDBPyRelation | None:
        """DuckDB's `sql`, computed now (None for a statement without rows, as with DuckDB)."""

        def run() -> duckdb.DuckDBPyRelation | None:
            relation = self.duckdb.sql(query, params=params)
            return None if relation is None else self.duckdb.from_arrow(relation.to_arrow_table())

        return retrying(run, duckdb_vanished)

    query = sql

    def __getattr__(self, name: str) -> object:
        return getattr(self.duckdb, name)

    def __enter__(self) -> StoreConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.duckdb.close()
