"""`tracetap vacuum`: delete the Delta tables' data files no recent version needs (store/maintenance.py)."""

from __future__ import annotations

import json

import click

from tracetap.common import store_option
from tracetap.store import DEFAULT_RETAIN_HOURS, StoreError, StorePath, vacuum


@click.command()
@store_option
@click.option("--retain", "retain_hours", type=click.IntRange(min=0), default=DEFAULT_RETAIN_HOURS,
              show_default=True, metavar="HOURS",
              help="Keep the files of every version committed in the last HOURS hours.")
@click.option("--dry-run", is_flag=True, help="Only list what would be deleted.")
@click.option("--json", "json_", is_flag=True, help="Print the deleted files per table as JSON.")
def command(store: StorePath, retain_hours: int, dry_run: bool, json_: bool) -> None:
    """Delete the data files of the store's Delta tables that no version within the retention needs.

    Each write replaces files and leaves the old ones for readers of older versions; vacuum reclaims
    them. A reader still on a version older than the retention (a long query, time travel) loses its
    files, so keep the default week unless nothing reads old versions. The history stays complete.

    Example: tracetap vacuum --store ./store --retain 24 --dry-run
    """
    try:
        removed = vacuum(store, retain_hours=retain_hours, dry_run=dry_run)
    except StoreError as error:
        raise click.ClickException(str(error)) from None
    if json_:
        click.echo(json.dumps({"retain_hours": retain_hours, "dry_run": dry_run, "removed": removed}))
        return
    verb = "would delete" if dry_run else "deleted"
    for table, files in removed.items():
        click.echo(f"{table}: {verb} {len(files)} file(s)")
    if not removed:
        click.echo("no Delta tables yet: nothing to vacuum")
