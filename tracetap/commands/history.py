"""`tracetap history`: the versions of the store's Delta tables and what wrote each (store/maintenance.py)."""

from __future__ import annotations

import click

from tracetap.common import echo_json, echo_table, store_option
from tracetap.store import StoreError, StorePath, TableVersion, history

COLUMNS = ("table", "version", "time", "operation", "writer", "rows_added", "files_added", "files_removed",
           "read_versions")


@click.command()
@store_option
@click.option("--table", "tables", multiple=True, metavar="TABLE",
              help="Only this Delta table (rewards, trajectories, ...); repeatable. Default: every one.")
@click.option("--limit", type=click.IntRange(min=1), help="At most N versions per table, the newest.")
@click.option("--json", "json_", is_flag=True, help="Print a JSON list of versions instead of a table.")
def command(store: StorePath, tables: tuple[str, ...], limit: int | None, json_: bool) -> None:
    """List the versions of the store's Delta tables, newest first: when (UTC), the operation, the
    writer that committed it, the rows it added, and the table versions its rows were made from (a
    build's: pass them to --as-of as TABLE=N,... to read what it read).

    Example: tracetap history --store ./store --table rewards --limit 5
    """
    try:
        versions = history(store, tables or None, limit)
    except StoreError as error:  # a ValueError too: caught first
        raise click.ClickException(str(error)) from None
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--table") from None
    (echo_json if json_ else echo_table)(COLUMNS, [_row(version, json_) for version in versions])


def _row(version: TableVersion, json_: bool) -> tuple[object, ...]:
    """One version as COLUMNS' values; the time as ISO 8601 to the millisecond (commits come fast); the read
    versions as a JSON object, or in a table as the `--as-of` text that reads them (TABLE=N,...)."""
    read = version.read_versions
    return (version.table, version.version, version.timestamp.isoformat(timespec="milliseconds"),
            version.operation, version.writer, version.rows_added, version.files_added, version.files_removed,
            read if json_ or read is None else _as_of_text(read))


def _as_of_text(versions: dict[str, int | None]) -> str:
    """TABLE=N,... of the tables that had a version (one without reads empty at the moment the rest name)."""
    return ",".join(f"{table}={number}" for table, number in versions.items() if number is not None)
