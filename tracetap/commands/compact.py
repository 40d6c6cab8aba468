"""`tracetap compact`: commit the calls writers' logs hold into the completions table (as a gateway does on close)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tracetap.common import store_option
from tracetap.store import InvalidSessionId, StoreReader, compact_sessions


def _checked(root: Path, session_id: str) -> str:
    try:
        recorded = StoreReader(root).recorded(session_id)
    except InvalidSessionId as error:
        raise click.BadParameter(str(error), param_hint="--session") from None
    if not recorded:
        raise click.ClickException(f"session {session_id!r} has no completions in {root}")
    return session_id


@click.command()
@store_option
@click.option("--session", "session_id", help="Compact only this session.")
@click.option("--json", "json_", is_flag=True, help="Print {session: calls committed} as JSON.")
def command(store: Path, session_id: str | None, json_: bool) -> None:
    """Commit each session's logged calls to the completions table, in one commit.

    Safe while a gateway is recording into the store: a call is committed once, and readers never see a
    row twice or miss one. The log segments are left to their gateway, which deletes what the table holds.

    Example: tracetap compact --store ./store --session run-1
    """
    wanted = None if session_id is None else [_checked(store, session_id)]
    committed = compact_sessions(store, wanted)
    if json_:
        click.echo(json.dumps(committed))
        return
    for sid, count in committed.items():
        click.echo(f"{sid}: committed {count} call{'s' if count != 1 else ''}")
    click.echo(f"compacted {len(committed)} session(s)")
