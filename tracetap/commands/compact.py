"""`tracetap compact`: merge logged rows and per-completion files into part files (as the gateway does on close)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tracetap.common import store_option
from tracetap.store import InvalidSessionId, StoreReader, compact_session, compact_store


def _compact_one(root: Path, session_id: str) -> int:
    try:
        recorded = StoreReader(root).recorded(session_id)
    except InvalidSessionId as error:
        raise click.BadParameter(str(error), param_hint="--session") from None
    if not recorded:
        raise click.ClickException(f"session {session_id!r} has no completions in {root}")
    return compact_session(root, session_id)


@click.command()
@store_option
@click.option("--session", "session_id", help="Compact only this session.")
@click.option("--json", "json_", is_flag=True, help="Print {session: rows merged} as JSON.")
def command(store: Path, session_id: str | None, json_: bool) -> None:
    """Merge each session's logged rows and per-completion files into one part file.

    Safe while a gateway is recording into the store: readers never see a row twice or miss one.

    Example: tracetap compact --store ./store --session run-1
    """
    merged = compact_store(store) if session_id is None else {session_id: _compact_one(store, session_id)}
    if json_:
        click.echo(json.dumps(merged))
        return
    for sid, count in merged.items():
        click.echo(f"{sid}: merged {count} row{'s' if count != 1 else ''}")
    click.echo(f"compacted {sum(1 for c in merged.values() if c)} session(s)")
