"""`tracetap migrate`: rewrite an older store in the current layout (store/migrate.py)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from tracetap.common import store_option
from tracetap.store import StoreError, migrate_store


@click.command()
@store_option
@click.option("--dry-run", is_flag=True, help="Only count what would be rewritten.")
@click.option("--json", "json_", is_flag=True, help="Print the counts as JSON.")
def command(store: Path, dry_run: bool, json_: bool) -> None:
    """Rewrite the store's sessions in the current schema version, one session at a time.

    Each session is switched atomically; an interrupted run leaves a readable store and is finished
    by running the command again. Stop the store's gateway first.

    Example: tracetap migrate --store ./store --dry-run
    """
    def progress(sid: str, rows: int) -> None:
        if not json_:
            click.echo(f"{sid}: {'would rewrite' if dry_run else 'rewrote'} {rows} row(s)")

    try:
        report = migrate_store(store, dry_run=dry_run, progress=progress)
    except StoreError as error:
        raise click.ClickException(str(error)) from None
    if json_:
        click.echo(json.dumps({**asdict(report), "dry_run": dry_run}))
        return
    verb = "would migrate" if dry_run else "migrated"
    click.echo(f"{verb} {report.sessions} session(s), {report.rows} row(s) in {report.files} file(s) "
               f"from schema version {report.from_version}; {report.current} session(s) already current")
