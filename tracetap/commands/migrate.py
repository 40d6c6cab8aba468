"""`tracetap migrate`: rewrite an older store in the current layout (store/migrate.py)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from tracetap.common import STORE
from tracetap.store import Migration, StoreError, migrate_store


@click.command()
@click.option("--store", required=True, type=STORE, help="Store directory (of any schema version up to this "
              "tracetap's; other commands refuse an older one until it is migrated).")
@click.option("--dry-run", is_flag=True, help="Only count what would be rewritten.")
@click.option("--json", "json_", is_flag=True, help="Print the counts as JSON.")
def command(store: Path, dry_run: bool, json_: bool) -> None:
    """Rewrite the store in the current schema version: every table becomes a Delta table, completions in
    the compact form.

    Each table is switched atomically; an interrupted run is finished by running the
    command again. Stop the store's gateway first.

    Example: tracetap migrate --store ./store --dry-run
    """
    def progress(what: str, rows: int) -> None:
        if not json_:
            click.echo(f"{what}: {'would rewrite' if dry_run else 'rewrote'} {rows} row(s)")

    try:
        report = migrate_store(store, dry_run=dry_run, progress=progress)
    except StoreError as error:
        raise click.ClickException(str(error)) from None
    if json_:
        click.echo(json.dumps({**asdict(report), "dry_run": dry_run}))
        return
    click.echo(summary(report, dry_run))


def summary(report: Migration, dry_run: bool) -> str:
    """The closing line: rows and files of each table switched to Delta."""
    verb = "would migrate" if dry_run else "migrated"
    tables = "".join(f"; {table}: {rows} row(s) from {report.table_files[table]} file(s)"
                     for table, rows in report.tables.items())
    return f"{verb} the store from schema version {report.from_version}{tables or '; nothing to switch'}"
