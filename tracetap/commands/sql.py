"""`tracetap sql`: run SQL over the store's views, or read statements from stdin like a DuckDB shell."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tracetap.common import as_of_option, decode, echo_json, echo_table, pinned, store_option
from tracetap.store import AsOf, connect

PROMPT, MORE = "tracetap> ", "     ...> "


def _run(con, sql: str, json_: bool) -> None:
    """Run each statement of `sql` in turn, printing the result of those that return rows."""
    import duckdb

    try:
        for statement in con.extract_statements(sql):
            result = con.execute(statement)
            if result.description:
                (echo_json if json_ else echo_table)([d[0] for d in result.description], result.fetchall())
    except duckdb.Error as error:
        raise click.ClickException(str(error)) from None


def _statements(stream, interactive: bool):
    """Complete statements (ending in `;`) from `stream`; a last one without `;` counts at EOF."""
    buffer: list[str] = []
    while True:
        if interactive:
            click.echo(MORE if buffer else PROMPT, nl=False, err=True)
        line = stream.readline()
        if not line:
            break
        buffer.append(line)
        text = "".join(buffer).strip()
        if text.endswith(";") and _complete(text):
            yield text
            buffer = []
    if "".join(buffer).strip():
        yield "".join(buffer).strip()


def _complete(text: str) -> bool:
    """True when the `;` that ends `text` is not inside a quoted string."""
    return text.count("'") % 2 == 0 and text.count('"') % 2 == 0


def _shell(con, json_: bool) -> None:
    failed = False
    for statement in _statements(sys.stdin, sys.stdin.isatty()):
        try:
            _run(con, statement, json_)
        except click.ClickException as error:
            failed = True
            click.echo(f"Error: {error.message}", err=True)
    if failed:
        sys.exit(1)


@click.command()
@store_option
@click.argument("sql", required=False)
@click.option("--json", "json_", is_flag=True, help="Print results as a JSON list instead of a table.")
@as_of_option
def command(store: Path, sql: str | None, json_: bool, as_of: AsOf | None) -> None:
    """Run SQL over the views completions, sessions, rewards, trajectories.

    With no SQL, read statements (each ending in `;`) from stdin. decode(ids) turns token ids into
    text with the embedded engine's tokenizer. With --as-of, every statement reads the store as it was then.

    Example: tracetap sql --store ./store "SELECT session_id, count(*) FROM completions GROUP BY 1"
    """
    import duckdb

    moment = pinned(store, as_of)
    try:
        con = connect(store, decode=decode, as_of=moment)
    except duckdb.Error as error:  # the views could not be made (a damaged file, say)
        raise click.ClickException(str(error)) from None
    if sql is None:
        _shell(con, json_)
    else:
        _run(con, sql, json_)
