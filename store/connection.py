"""The DuckDB connection `store.connect` hands out: SQL that survives compaction under it.

Before every statement the connection lists the store again (`refresh`, which points the views at
the files of a fresh snapshot); DuckDB opens them while the statement runs, and a compaction in between
deletes some (store/reading.py). `execute` and `sql` then run the statement again from a new listing,
and a failed statement left nothing behind (DuckDB rolls it back).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tracetap.store.reading import file_vanished, retrying

if TYPE_CHECKING:
    import duckdb

VANISHED_MESSAGES = ("No such file or directory", "No files found that match the pattern")


def duckdb_vanished(error: BaseException) -> bool:
    """Whether the listing before a statement raced compaction, or DuckDB found a listed file gone."""
    import duckdb

    gone = isinstance(error, duckdb.IOException) and any(text in str(error) for text in VANISHED_MESSAGES)
    return gone or file_vanished(error)


class StoreConnection:
    """A DuckDB connection over the store's views (`.duckdb`); other attributes are DuckDB's own.

    `sql()` returns its result already computed (an in-memory relation), so the retry covers it too.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, refresh: Callable[[], None]) -> None:
        self.duckdb = con
        self.refresh = refresh

    def execute(self, query: str, parameters: object = None) -> duckdb.DuckDBPyConnection:
        """Run `query`; fetch its rows from the returned DuckDB connection, as with DuckDB."""

        def run() -> duckdb.DuckDBPyConnection:
            self.refresh()
            return self.duckdb.execute(query, parameters)

        return retrying(run, duckdb_vanished)

    def sql(self, query: str, params: object = None) -> duckdb.DuckDBPyRelation | None:
        """DuckDB's `sql`, computed now (None for a statement without rows, as with DuckDB)."""

        def run() -> duckdb.DuckDBPyRelation | None:
            self.refresh()
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
