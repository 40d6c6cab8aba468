"""`tracetap demo`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from tracetap.rollout.harnesses import ALIASES, CLI_HARNESSES


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=Path("demo-out"), show_default=True,
              help="Folder for the store, workspaces, dataset and report (replaced if it exists).")
@click.option("--sessions", type=click.IntRange(1, 50), default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print only the summary, as JSON.")
@click.option("--harness", type=click.Choice([*CLI_HARNESSES, *ALIASES]), default=None,
              help="Run this real coding-agent CLI (installed from npm) instead of the built-in agent.")
@click.option("--runtime", type=click.Choice(["local", "docker"]), default="local", show_default=True,
              help="Where the built-in agent's sessions run: this machine, or Docker containers ($DOCKER_HOST; "
                   "the image is built on first use).")
def command(out: Path, sessions: int, as_json: bool, harness: str | None, runtime: str) -> None:
    """Run the main job end to end on embedded defaults: capture, build, evaluate, export, report.

    Example: tracetap demo --sessions 3   (or --harness claude_code, once installed; or --runtime docker)
    """
    from tracetap.demo import demo_image, run_demo
    from tracetap.rollout.harnesses import cli_harness
    from tracetap.rollout.harnesses.npm import HarnessError, require_binary
    from tracetap.rollout.images.daemon import ImageError

    if harness and runtime != "local":
        raise click.UsageError("--harness runs the CLI on this machine; --runtime docker is for the built-in agent")
    started = time.monotonic()
    say = (lambda _: None) if as_json else click.echo
    try:
        if harness:
            require_binary(cli_harness(harness))  # before the output folder is replaced
        image = demo_image(lambda line: click.echo(line, err=True)) if runtime == "docker" else None
        result = run_demo(out, sessions=sessions, say=say, harness=harness, image=image)
    except (HarnessError, ImageError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result.summary, default=str))
        return
    click.echo("\nsummary (one SQL query over the store):")
    for key, value in result.summary.items():
        click.echo(f"  {key:30} {value}")
    click.echo(f"\nstore:   {result.store}\ndataset: {result.dataset}\nreport:  {result.report}")
    click.echo(f"done in {time.monotonic() - started:.1f}s")
