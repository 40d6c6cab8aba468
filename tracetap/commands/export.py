"""`tracetap export`: a builder's trajectories with rewards joined, as a training dataset."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from tracetap.builders.exports import FORMATS, ExportSummary
from tracetap.common import as_of_option, pinned, store_option
from tracetap.store import AsOf


@click.command()
@store_option
@click.option("--builder", required=True, help="Trajectories to export (per_request, prefix_merging).")
@click.option("--format", "fmt", required=True, type=click.Choice(FORMATS),
              help="parquet (canonical), jsonl, slime, verl, or atif (a directory, one JSON per session).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Output file (atif: directory).")
@click.option("--max-tokens", type=click.IntRange(min=1),
              help="Token budget: clip responses to fit; a trace whose prompt fills it is dropped.")
@click.option("--evaluator", help="Join this evaluator's rewards (its stored name, e.g. test_on_output).")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@as_of_option
def command(store: Path, builder: str, fmt: str, out: Path, max_tokens: int | None, evaluator: str | None,
            force: bool, as_json: bool, as_of: AsOf | None) -> None:
    """Write a training dataset with rewards joined: one row per trace.

    With --format atif, --out is a directory with one ATIF JSON document per session.

    Outputs are written to a temp name and renamed into place when complete.

    --json prints table_versions, the table versions read: --as-of TABLE=N,... with them writes the same
    dataset again later.

    Example: tracetap export --store runs --builder prefix_merging --format parquet
    --out train.parquet --evaluator test_on_output --max-tokens 32768
    """
    from tracetap.builders.export_writers import OutputExists
    from tracetap.builders.exports import ExportError, export, trajectory_sessions

    moment = pinned(store, as_of)
    try:
        total = len(trajectory_sessions(store, builder, moment))
        err = sys.stderr  # looked up now: click's runner swaps it
        with click.progressbar(length=total, label=f"exporting {fmt}", file=err) as bar:
            summary = export(store, builder, fmt, out, max_tokens=max_tokens, evaluator=evaluator,
                             force=force, on_session=lambda _sid: bar.update(1), as_of=moment)
    except (ExportError, OutputExists, ValueError) as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(summary), indent=2))
    else:
        _echo_summary(summary)


def _echo_summary(summary: ExportSummary) -> None:
    click.echo(f"wrote {summary.written} trace(s) of {summary.sessions} session(s) to {summary.out}")
    click.echo(f"  clipped to the budget: {summary.clipped}; dropped (prompt over budget): "
               f"{summary.dropped_over_budget}")
    click.echo(f"  error traces: {summary.error_traces}; not trainable: {summary.not_trainable_traces}; "
               f"without reward: {summary.unrewarded_traces}")
