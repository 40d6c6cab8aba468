"""`tracetap demo`."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=Path("demo-out"), show_default=True,
              help="Folder for the store, workspaces and exports (replaced if it exists).")
@click.option("--sessions", type=click.IntRange(1, 50), default=3, show_default=True)
def command(out: Path, sessions: int) -> None:
    """Run the main job end to end on embedded defaults.

    Example: tracetap demo --sessions 3
    """
    from tracetap.demo import run_demo

    result = run_demo(out, sessions=sessions)
    for run in result.runs:
        click.echo(f"{run.session_id}: {run.turns} turns, tools {', '.join(run.tool_calls)}")
    click.echo("\nsummary (SQL over the store):")
    for key, value in result.summary.items():
        click.echo(f"  {key:30} {value}")
    click.echo(f"\nstore: {result.store}")
