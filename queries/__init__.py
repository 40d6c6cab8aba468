"""Named SQL queries over the store's views, run by `tracetap query NAME`.

Each `queries/<name>.sql` starts with a header comment: the first lines say what it answers, then
one line per parameter, `-- @param NAME (TYPE, default VALUE): meaning`, TYPE one of int, float,
str, and VALUE a literal or `null`. The SQL refers to parameters as `$NAME`; values are bound as
DuckDB prepared-statement parameters, never pasted into the SQL text. Stored JSON is parsed as
`parseable_json(column)` (store/catalog.py), so one row's lone surrogate never fails a query.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb
    from tracetap.store import StoreConnection  # what tracetap.store.connect() returns

QUERY_DIR = Path(__file__).parent
NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_PARAM = re.compile(r"^--\s*@param\s+(\w+)\s*\((int|float|str),\s*default\s+(.*?)\):\s*(.*)$")
_CASTS = {"int": int, "float": float, "str": str}


class QueryError(ValueError):
    """An unknown query, a malformed query file, or a bad parameter."""


@dataclass(frozen=True)
class QueryParam:
    name: str
    type: str
    default: Any
    doc: str

    def convert(self, text: str) -> Any:
        """The typed value of `--param NAME=text` (`null` gives SQL NULL)."""
        if text == "null":
            return None
        try:
            return _CASTS[self.type](text)
        except ValueError:
            raise QueryError(f"parameter {self.name} must be {self.type}, got {text!r}") from None


@dataclass(frozen=True)
class NamedQuery:
    name: str
    description: str
    params: tuple[QueryParam, ...]
    sql: str


def _param(match: re.Match) -> QueryParam:
    name, type_, default, doc = match.groups()
    param = QueryParam(name, type_, None, doc.strip())
    return dataclasses.replace(param, default=param.convert(default.strip().strip("'")))


def parse_query(name: str, text: str) -> NamedQuery:
    """A query from its file text: the leading `--` lines are its header."""
    description, params = [], []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        match = _PARAM.match(line)
        if match:
            params.append(_param(match))
        elif line.lstrip("- ").startswith("@param"):
            raise QueryError(f"query {name}: malformed parameter line {line!r}")
        elif line.strip("- "):
            description.append(line.lstrip("-").strip())
    if not description:
        raise QueryError(f"query {name}: missing header comment")
    return NamedQuery(name, " ".join(description), tuple(params), text)


def load_query(name: str) -> NamedQuery:
    """The named query from queries/<name>.sql."""
    if not NAME.fullmatch(name) or not (QUERY_DIR / f"{name}.sql").is_file():
        known = ", ".join(q.name for q in list_queries())
        raise QueryError(f"unknown query {name!r}; known queries: {known}")
    return parse_query(name, (QUERY_DIR / f"{name}.sql").read_text())


def list_queries() -> list[NamedQuery]:
    """Every named query, by name."""
    return [parse_query(path.stem, path.read_text()) for path in sorted(QUERY_DIR.glob("*.sql"))]


def bind(query: NamedQuery, given: dict[str, str]) -> dict[str, Any]:
    """Typed values for every declared parameter: the given text converted, else the default."""
    declared = {param.name: param for param in query.params}
    unknown = set(given) - set(declared)
    if unknown:
        names = ", ".join(declared) or "none"
        raise QueryError(f"query {query.name} has no parameter {', '.join(sorted(unknown))}; "
                         f"its parameters: {names}")
    return {name: param.convert(given[name]) if name in given else param.default
            for name, param in declared.items()}


def run_query(con: StoreConnection | duckdb.DuckDBPyConnection, name: str, given: dict[str, str] | None = None):
    """Run a named query; returns the DuckDB result (`.fetchall()`, `.description`, `.to_arrow_table()`)."""
    query = load_query(name)
    return con.execute(query.sql, bind(query, given or {}))
