"""`tracetap show`: one session turn by turn, and its trajectories token by token."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from tracetap.common import decode_token, jsonable, store_option
from tracetap.report.session_view import BUILDER_ORDER, SessionNotFound, load_session_view
from tracetap.store import InvalidSessionId


@click.command()
@store_option
@click.argument("session")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the session as one self-contained HTML page to this file.")
@click.option("--builder", type=click.Choice(BUILDER_ORDER), default=None,
              help="Trajectories to show [default: prefix_merging, else per_request].")
@click.option("--json", "json_", is_flag=True, help="Print the session (turns, traces, tokens) as JSON.")
def command(store: Path, session: str, html_file: Path | None, builder: str | None, json_: bool) -> None:
    """Show SESSION: each call (API, model, status, latency, finish, tool calls, tokens, text), then
    its trajectories with trainable, interstitial and prompt tokens colored and their logprobs.

    Example: tracetap show --store ./store sk-tap-demo-1 --html session.html
    """
    from tracetap.report.html import render_session_page
    from tracetap.report.terminal import render_session

    try:
        view = load_session_view(store, session, decode_token, builder)
    except (InvalidSessionId, SessionNotFound) as error:
        raise click.ClickException(str(error)) from None
    if html_file is not None:
        html_file.parent.mkdir(parents=True, exist_ok=True)
        html_file.write_text(render_session_page(view), encoding="utf-8")
        click.echo(f"wrote {html_file}", err=json_)
    if json_:
        # one line: a long trace has thousands of tokens (pipe through `jq` to read it)
        click.echo(json.dumps(asdict(view), default=jsonable, ensure_ascii=False))
    elif html_file is None:
        click.echo(render_session(view))
