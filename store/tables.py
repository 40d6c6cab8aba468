"""Rows to Arrow tables with the store schema, and the writer for per-session derived tables.

Builders write `trajectories`, evaluators write `rewards`; both go through `write_session_table`
(or `write_session_tables` for a batch of sessions), which checks every row against the schema before
anything is committed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

import pyarrow as pa
from tracetap.store.delta import read_versions_metadata, replace, sql_in
from tracetap.store.files import storage_schema
from tracetap.store.location import StorePath, store_path
from tracetap.store.paths import validate_name, validate_session_id
from tracetap.store.schema import STORED_TABLES

MAX_PLAIN_LIST = 32  # items of a list checked in Python; a longer one converts faster in Arrow
_STORAGE = {name: storage_schema(schema) for name, schema in STORED_TABLES.items()}
_ROW = {name: pa.struct(list(schema)) for name, schema in _STORAGE.items()}
_NAMES = {name: frozenset(schema.names) for name, schema in STORED_TABLES.items()}
_REQUIRED = {name: [f.name for f in schema if not f.nullable] for name, schema in STORED_TABLES.items()}


def rows_to_table(table: str, rows: list[dict]) -> pa.Table:
    """Rows (missing columns null) as an Arrow table of `table`'s stored schema (completions: compact
    columns included); unknown columns are an error."""
    _check_names(table, rows)
    try:  # one struct conversion: ~4x cheaper than Table.from_pylist for the gateway's one-row checks
        return pa.Table.from_struct_array(pa.array(rows, type=_ROW[table]))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as error:
        check_rows(table, rows)  # names the column that does not fit
        raise ValueError(f"{table} rows do not fit the schema: {error}") from None


def check_rows(table: str, rows: list[dict]) -> None:
    """Raises ValueError unless rows_to_table(table, rows) would succeed, without building the table.

    Scalars and short lists of scalars are checked in Python where a plain check settles it (the commit
    log checks every row, and Arrow's conversion costs ~3 us per column even for one row); long lists,
    structs and whatever a plain check cannot vouch for go through Arrow, one conversion per column."""
    _check_names(table, rows)
    checks = _CHECKS[table]
    unsettled = dict.fromkeys(name for row in rows for name, value in row.items()  # ordered: one row names one column
                              if value is not None and not ((fits := checks[name][1]) is not None and fits(value)))
    for name in unsettled:
        field = checks[name][0]
        try:
            pa.array([row.get(name) for row in rows], field.type)
        except (ValueError, TypeError, OverflowError) as error:
            raise ValueError(f"{table} rows do not fit the schema: column {name} ({field.type}): {error}") from None


def _check_names(table: str, rows: list[dict]) -> None:
    for row in rows:
        unknown = row.keys() - _NAMES[table]
        if unknown:
            raise ValueError(f"unknown {table} column(s): {', '.join(sorted(unknown))}")
    for name in _REQUIRED[table]:
        if any(row.get(name) is None for row in rows):
            raise ValueError(f"{table} column {name} must not be null")


def _plain_check(type_: pa.DataType) -> Callable[[object], bool] | None:
    """A check whose True means Arrow converts the value to `type_` (False leaves the verdict to Arrow);
    None for the types only Arrow checks."""
    if pa.types.is_string(type_):
        return _is_text
    if pa.types.is_integer(type_):
        signed = pa.types.is_signed_integer(type_)
        low, high = (-(1 << (type_.bit_width - 1)), (1 << (type_.bit_width - 1)) - 1) if signed else \
            (0, (1 << type_.bit_width) - 1)
        return lambda value: type(value) is int and low <= value <= high
    if pa.types.is_floating(type_):
        exact = 1 << _MANTISSA_BITS[type_.bit_width]  # Arrow refuses an int the float cannot hold exactly
        return lambda value: type(value) is float or (type(value) is int and -exact <= value <= exact)
    if pa.types.is_boolean(type_):
        return lambda value: type(value) is bool
    if pa.types.is_timestamp(type_):
        return lambda value: type(value) is datetime
    if pa.types.is_list(type_) and (item := _plain_check(type_.value_type)) is not None:
        return lambda value: type(value) is list and len(value) <= MAX_PLAIN_LIST and all(map(item, value))
    return None


def _is_text(value: object) -> bool:
    """A str Arrow can store: UTF-8 has no lone surrogates."""
    if type(value) is not str:
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


_MANTISSA_BITS = {16: 11, 32: 24, 64: 53}  # by float width: ints up to 2**bits are held exactly
_CHECKS = {name: {field.name: (field, _plain_check(field.type)) for field in schema}
           for name, schema in _STORAGE.items()}


def write_session_table(root: StorePath | str, table: str, session_id: str, rows: list[dict], *,
                        builder: str | None = None, evaluator: str | None = None, writer: str = "tracetap") -> None:
    """Replace one session's rows of `builder` in `trajectories`, or of `evaluator` in `rewards`.

    Rows may omit `session_id` and the key (`builder` or `evaluator`); rows naming another session or
    key are rejected. No rows: the session's rows of that key are removed."""
    write_session_tables(root, table, [(session_id, rows)], builder=builder, evaluator=evaluator, writer=writer)


def write_session_tables(root: StorePath | str, table: str, sessions: list[tuple[str, list[dict]]], *,
                         builder: str | None = None, evaluator: str | None = None, writer: str = "tracetap",
                         read_versions: Mapping[str, int | None] | None = None) -> None:
    """write_session_table for several sessions `(session id, rows)` in one Delta commit (store/delta.py):
    readers see every session's new rows or none of them. Every row is checked before anything is written.
    `read_versions`: the table versions the rows were made from, kept in the commit's metadata."""
    column, key = _key(table, builder, evaluator)
    fixed_rows = [row for sid, rows in sessions for row in _fixed(validate_session_id(sid), column, key, rows)]
    checked = rows_to_table(table, fixed_rows)
    where = f"{column} = '{key}' AND {sql_in('session_id', [sid for sid, _ in sessions])}"
    metadata = None if read_versions is None else read_versions_metadata(read_versions)
    replace(store_path(root), table, checked, where, writer, metadata)


def _key(table: str, builder: str | None, evaluator: str | None) -> tuple[str, str]:
    """(the column whose value a write replaces rows of, its value): trajectories by builder, rewards by evaluator."""
    if table == "trajectories" and builder is not None and evaluator is None:
        return "builder", validate_name(builder, "builder")
    if table == "rewards" and evaluator is not None and builder is None:
        return "evaluator", validate_name(evaluator, "evaluator name")
    raise ValueError("write_session_tables writes trajectories of one builder or rewards of one evaluator")


def _fixed(sid: str, column: str, key: str, rows: list[dict]) -> list[dict]:
    """Rows with their session id and key filled in; a row naming other ones is an error."""
    fixed = {"session_id": sid, column: key}
    for row in rows:
        clash = {k: row[k] for k in fixed if row.get(k) not in (None, fixed[k])}
        if clash:
            raise ValueError(f"row {clash} does not belong to {fixed}")
    return [{**row, **fixed} for row in rows]
