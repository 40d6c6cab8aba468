"""`tracetap history`: the versions of the store's Delta tables and what wrote each (store/maintenance.py)."""

from __future__ import annotations

import click

from tracetap.common import echo_json, echo_table, store_option
from tracetap.store import StoreError, StorePath, TableVersion, history

COLUMNS = ("table", "version", "time", "operation", "writer", "rows_added", "files_added", "files_removed")


@click.command()
@store_option
@click.option("--table", "tables", multiple=True, metavar="TABLE",
              help="Only this Delta table (rewards, trajectories, ...); repeatable. Default: every one.")
@click.option("--limit", type=click.IntRange(min=1), help="At most N versions per table, the newest.")
@click.option("--json", "json_", is_flag=True, help="Print a JSON list of versions instead of a table.")
def command(store: StorePath, tables: tuple[str, ...], limit: int | None, json_: bool) -> None:
    """List the versions of the store's Delta tables, newest first: when (UTC), the operation, the
    writer that committed it, and the rows it added.

    Example: tracetap history --store ./store --table rewards --limit 5
    """
    try:
        versions = history(store, tables or None, limit)
    except StoreError as error:  # a ValueError too: caught first
        raise click.ClickException(str(error)) from None
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--table") from None
    (echo_json if json_ else echo_table)(COLUMNS, [_row(version) for version in versions])


def _row(version: TableVersion) -> tuple[object, ...]:
    """One version as COLUMNS' values; the time as ISO 8601 to the millisecond (commits come fast)."""
    return (version.table, version.version, version.timestamp.isoformat(timespec="milliseconds"),
            version.operation, version.writer, version.rows_added, version.files_added, version.files_removed)
