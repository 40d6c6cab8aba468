"""`tracetap evaluate`: score sessions with an evaluator and write the `rewards` partition."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from tracetap.common import echo_json, echo_table, key_value_pairs, store_option


def _config_value(text: str) -> object:
    """`--config` values that look like JSON objects or lists are parsed; anything else stays text."""
    if text.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            message = f"{text[:40]!r} is not valid JSON: {error}"
            raise click.BadParameter(message, param_hint="--config") from None
    return text


@click.command()
@store_option
@click.option("--evaluator", "spec", required=True,
              help="Built-in (session_completed, test_on_output) or module:Class.")
@click.option("--config", "config", multiple=True, metavar="KEY=VALUE", callback=key_value_pairs,
              help="Evaluator config; VALUE is JSON when it starts with { or [, else text. Repeatable.")
@click.option("--session", "session_ids", multiple=True, metavar="SID",
              help="Only these sessions. Repeatable.")
@click.option("--builder", default="prefix_merging", show_default=True,
              help="Whose trajectories the evaluator sees (and per-trace rewards must match).")
@click.option("--workspace-root", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Each session's workspace is DIR/<session_id> (default: metadata `workspace`).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              help="Time budget per session, in seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def command(store: Path, spec: str, config: dict, session_ids: tuple[str, ...], builder: str,
            workspace_root: Path | None, timeout: float, as_json: bool) -> None:
    """Score sessions with an evaluator; results go to the store's rewards.

    Each session's result replaces its row of the evaluator in the rewards table.

    A failing evaluation is recorded (reward null, the error in details) and reported here.

    Example: tracetap evaluate --store runs --evaluator test_on_output
    --config 'test_command=python -m pytest -v' --config 'expected={"test_x.py::test_a": "PASSED"}'
    """
    from tracetap.evaluators.runner import EvaluationJob

    try:
        job = EvaluationJob(store, spec, {k: _config_value(v) for k, v in config.items()},
                            session_ids=list(session_ids) or None, builder=builder,
                            workspace_root=workspace_root, timeout=timeout)
    except ValueError as error:  # EvaluatorError, InvalidSessionId: bad input, nothing written
        raise click.ClickException(str(error)) from None
    err = sys.stderr  # looked up now: click's runner swaps it
    with click.progressbar(job.sessions, label=f"evaluating with {job.name}", file=err) as bar:
        scores = [job.score(session) for session in bar]
    columns = ["session_id", "reward", "trace_rewards", "error"]
    rows = [(s.session_id, s.reward, s.trace_rewards, s.error) for s in scores]
    echo_json(columns, rows) if as_json else echo_table(columns, rows)
    failed = sum(1 for s in scores if s.error)
    click.echo(f"{len(scores)} session(s) scored with {job.name}; {failed} evaluation(s) failed", err=True)
