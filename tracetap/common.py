"""Pieces the commands share: the `--store`, `--as-of` and `--listen` options, aligned tables, JSON output."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from functools import cache
from pathlib import Path

import click

from tracetap.store import (
    AsOf,
    AsOfError,
    InvalidLocation,
    StoreError,
    StorePath,
    check_reachable,
    check_store,
    parse_as_of,
    store_path,
)

MAX_CELL = 80


class StoreLocation(click.ParamType):
    """A store: a directory, or an object store URL such as s3://bucket/prefix (any fsspec protocol)."""

    name = "DIR|URL"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> StorePath:
        if isinstance(value, Path):
            return value
        try:
            return store_path(str(value))
        except InvalidLocation as error:
            self.fail(str(error), param, ctx)


STORE = StoreLocation()


def _check_store(ctx: click.Context, param: click.Parameter, value: StorePath) -> StorePath:
    try:
        return check_store(value)
    except StoreError as error:
        raise click.BadParameter(str(error), ctx, param) from None


def reachable_store(ctx: click.Context, param: click.Parameter, value: StorePath) -> StorePath:
    """Click callback for a store to write to: an object store's bucket must exist and answer."""
    try:
        check_reachable(value)
    except InvalidLocation as error:
        raise click.BadParameter(str(error), ctx, param) from None
    return value


def store_option(function):
    """`--store DIR|URL`, required, checked to be an existing tracetap store (it has a VERSION file)."""
    return click.option("--store", required=True, type=STORE, callback=_check_store,
                        help="Store directory or object store URL (as given to `tracetap gateway --store`)."
                        )(function)


class AsOfText(click.ParamType):
    """`--as-of`: a moment of the store (store.parse_as_of); a malformed one is a usage error naming it."""

    name = "VERSION|TIMESTAMP|TABLE=N,..."

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> AsOf:
        if isinstance(value, AsOf):
            return value
        try:
            return parse_as_of(str(value))
        except AsOfError as error:
            self.fail(str(error), param, ctx)


AS_OF_HELP = ("Read the store as it was: an ISO 8601 timestamp (UTC unless it says), a completions version N "
              "(other tables as of its commit), or TABLE=N,... (what builds and exports record; other tables "
              "as of the latest of those commits). Committed rows only: what writers held uncommitted is not "
              "versioned. A table not yet created then reads empty.")


def as_of_option(function):
    """`--as-of VERSION|TIMESTAMP|TABLE=N,...`, optional: parsed here, resolved against the store by `pinned`."""
    return click.option("--as-of", "as_of", type=AsOfText(), default=None, help=AS_OF_HELP)(function)


def pinned(store: StorePath, as_of: AsOf | None) -> AsOf | None:
    """`--as-of` resolved against the store once (every table's version), so all the command reads is of one
    moment; a moment the store lacks (a version it does not have) is a usage error naming it (exit 2), an
    unreadable Delta log an error (exit 1)."""
    if as_of is None:
        return None
    try:
        return as_of.pin(store)
    except AsOfError as error:
        raise click.BadParameter(str(error), param_hint="'--as-of'") from None
    except StoreError as error:  # a table's Delta log could not be read: the store's fault, not the option's
        raise click.ClickException(str(error)) from None


def listen_address(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    """Click callback for `--listen HOST:PORT`: (host, port); port 0 lets the server pick a free one."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


def jsonable(value: object) -> object:
    """`json.dumps(default=jsonable)`: the values DuckDB and the store hand out that JSON has no type for."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def echo_json(columns: Sequence[str], rows: Sequence[Sequence]) -> None:
    """Rows as a JSON list of objects, one key per column; a lone surrogate (stored text a harness sent) as its
    JSON escape, since no output encodes it."""
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    text = json.dumps(records, default=jsonable, ensure_ascii=False, indent=2)
    click.echo(text.encode("utf-8", "backslashreplace").decode("utf-8"))


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        text = value.isoformat(sep=" ", timespec="seconds")
    elif isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, dict):  # a MAP column: key=value pairs
        text = " ".join(f"{key}={item}" for key, item in value.items())
    else:
        text = str(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def echo_table(columns: Sequence[str], rows: Sequence[Sequence]) -> None:
    """Rows as an aligned text table (numbers right-aligned, long cells cut at MAX_CELL)."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(columns)]
    numeric = [bool(rows) and all(isinstance(row[i], int | float | Decimal) or row[i] is None for row in rows)
               for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        padded = [v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric, strict=True)]
        return "  ".join(padded).rstrip()

    click.echo(line(list(columns)))
    click.echo("  ".join("-" * width for width in widths))
    for row in cells:
        click.echo(line(row))
    click.echo(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")


def key_value_pairs(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> dict[str, str]:
    """Click callback for repeated `KEY=VALUE` options: {KEY: VALUE} (the last one wins)."""
    pairs = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", ctx, param)
        pairs[key] = value
    return pairs


@cache
def _tokenizer():
    from tracetap.engine.tokenizer import load_tokenizer  # a second or two; only when something is decoded

    return load_tokenizer()


def decode(ids: Sequence[int]) -> str:
    """Token ids as text with the embedded engine's Qwen3 tokenizer (the one tracetap builds offline);
    what `decode(ids)` in SQL and the viewers use."""
    return _tokenizer().decode(ids)


def decode_token(token_id: int) -> str:
    return decode([token_id])
