"""`tracetap build`: rebuild training traces from a store's completions."""

from __future__ import annotations

import json
import sys

import click

from tracetap.common import STORE, as_of_option, pinned
from tracetap.store import AsOf, StorePath

BUILDER_NAMES = ("per_request", "prefix_merging")


def _summary_lines(summary: dict) -> list[str]:
    breaks = ", ".join(f"{reason} {count}" for reason, count in sorted(summary["break_reasons"].items()))
    not_trainable = summary["not_trainable"]
    return [
        f"builder         {summary['builder']}",
        f"sessions        {summary['sessions']}",
        f"traces          {summary['traces']}",
        f"chains          {summary['chains']}",
        f"segments        {summary['segments']}",
        f"breaks          {sum(summary['break_reasons'].values())}" + (f" ({breaks})" if breaks else ""),
        f"retries         {summary['retries']}",
        f"drift tokens    {summary['drift_tokens']}" + _by_kind(summary["drift_tokens_by_kind"]),
        f"degraded calls  {summary['degraded']} (answered without training data, left out)",
        f"not trainable   {len(not_trainable)}" + (f" ({', '.join(not_trainable)})" if not_trainable else ""),
        f"versions read   {_versions(summary['table_versions'])}",
    ]


def _versions(versions: dict[str, int | None]) -> str:
    """The table versions read, as --as-of reads them again (TABLE=N,...: a table without a commit left out)."""
    return ",".join(f"{table}={version}" for table, version in versions.items() if version is not None) or "-"


def _by_kind(counts: dict[str, int]) -> str:
    return f" ({', '.join(f'{kind} {n}' for kind, n in sorted(counts.items()))})" if counts else ""


@click.command("build")
@click.option("--store", "store_dir", required=True, type=STORE, help="Store directory or object store URL.")
@click.option("--builder", required=True, type=click.Choice(BUILDER_NAMES),
              help="per_request: one trace per call; prefix_merging: one trace per chain segment.")
@click.option("--session", "sessions", multiple=True, metavar="SID",
              help="Build only this session (repeatable). Default: every session.")
@click.option("--eot-id", type=click.IntRange(min=0), default=None,
              help="End-of-turn token id (default: detected from naturally stopped calls).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes building in parallel (default: one per core from 128 sessions on, else 1).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary (with per-session stats) as JSON.")
@as_of_option
def command(store_dir: StorePath, builder: str, sessions: tuple[str, ...], eot_id: int | None,
            workers: int | None, as_json: bool, as_of: AsOf | None) -> None:
    """Build trajectories into STORE/trajectories/builder=<name>/.

    With --as-of, build from the store as it was then (its committed calls); the traces replace today's.
    Each trajectories commit records the completions and sessions versions it read (`tracetap history`);
    --json prints them as table_versions.

    Example: tracetap build --store ./store --builder prefix_merging
    """
    from tracetap.builders import build, default_workers, list_sessions
    from tracetap.common import decode
    from tracetap.store import StoreError, check_store

    try:
        moment = pinned(check_store(store_dir), as_of)
        wanted = list(sessions) or list_sessions(store_dir, moment)
        with click.progressbar(length=len(wanted), label=f"building {builder}", file=sys.stderr,
                               show_pos=True) as bar:
            summary = build(store_dir, builder, wanted, eot_id=eot_id, progress=lambda _sid: bar.update(1),
                            decode=decode, workers=workers or default_workers(len(wanted)), as_of=moment)
    except (StoreError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(summary.to_dict(), indent=2))
    else:
        click.echo("\n".join(_summary_lines(summary.to_dict())))
