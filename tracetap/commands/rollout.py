"""`tracetap rollout serve|submit|status|cancel`: the rollout server and a client of it."""

from __future__ import annotations

import importlib.util
import json
import signal
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tracetap.common import listen_address
from tracetap.rollout.client import DEFAULT_SERVER

if TYPE_CHECKING:
    from tracetap.rollout.serve import ServeConfig

server_option = click.option("--server", default=DEFAULT_SERVER, show_default=True, help="Rollout server URL.")


@click.group()
def command() -> None:
    """Run TaskRequests: each sample a session on a gateway node, built, scored, called back."""


@command.command()
@click.option("--store", type=click.Path(file_okay=False, path_type=Path), default=Path("rollout-store"),
              show_default=True, help="Store directory (created when missing).")
@click.option("--upstream", default="local", show_default=True, help="Engine base URL, or 'local' (embedded).")
@click.option("--script", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Scripted mode for the embedded engine (JSONL of assistant messages per session).")
@click.option("--nodes", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--ray", "ray_address", default=None, metavar="ADDR",
              help="Run each node as a Ray actor: 'local' starts a private cluster, or a cluster address "
                   "('auto', HOST:PORT, ray://...).")
@click.option("--init-workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--run-workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--postrun-workers", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--listen", default="127.0.0.1:8790", show_default=True, callback=listen_address,
              help="HOST:PORT to serve on.")
@click.option("--gateway-mode", type=click.Choice(["reverse", "proxy"]), default="reverse", show_default=True,
              help="proxy: the gateway is also an HTTPS proxy, so tasks may set agent.capture: proxy.")
def serve(store: Path, upstream: str, script: Path | None, nodes: int, ray_address: str | None,
          init_workers: int, run_workers: int, postrun_workers: int, listen: tuple[str, int],
          gateway_mode: str) -> None:
    """Serve the rollout API until Ctrl-C (running tasks are cancelled on exit)."""
    from tracetap.rollout.serve import LOCAL, ServeConfig

    if script is not None and upstream != LOCAL:
        raise click.UsageError("--script drives the embedded engine; it cannot be combined with --upstream URL")
    unreachable: tuple[type[Exception], ...] = ()  # what a --ray address no cluster answers at raises
    if ray_address is not None:
        if importlib.util.find_spec("ray") is None:
            raise click.UsageError("--ray needs Ray: pip install 'tracetap[ray]'")
        from tracetap.rollout.ray_nodes import RayUnavailable

        unreachable = (RayUnavailable,)
    config = ServeConfig(store, upstream, script, nodes, init_workers, run_workers, postrun_workers,
                         ray=ray_address, gateway_mode=gateway_mode)
    try:
        _serve(config, listen)
    except unreachable as exc:
        _fail(exc)


def _serve(config: ServeConfig, listen: tuple[str, int]) -> None:
    from tracetap.rollout.serve import rollout_server

    where = f"Ray actors on {config.ray}" if config.ray else "in-process"
    with rollout_server(config, *listen) as server:
        signal.signal(signal.SIGTERM, _interrupt)  # after Ray's own handler: stop as on Ctrl-C
        click.echo(f"rollout server on {server.url} ({config.nodes} node(s), {where}, store {config.store}); "
                   "Ctrl-C stops it")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            click.echo("stopping")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _client(server: str):
    from tracetap.rollout.client import RolloutClient

    return RolloutClient(server)


def _fail(exc: Exception) -> None:
    raise click.ClickException(str(exc)) from None


def _progress_printer() -> Callable[[Counter[str]], None]:
    """Prints one line per change: how many of the task's sessions are in each stage."""
    shown: list[str] = []

    def show(counts: Counter[str]) -> None:
        line = " · ".join(f"{status} {n}" for status, n in sorted(counts.items()))
        if not shown or shown[-1] != line:
            click.echo(line, err=True)
            shown.append(line)
    return show


@command.command()
@click.argument("task_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@server_option
@click.option("--wait", is_flag=True, help="Wait for the task to end, showing its sessions' stages.")
@click.option("--json", "as_json", is_flag=True, help="Print the TaskResult as JSON.")
def submit(task_file: Path, server: str, wait: bool, as_json: bool) -> None:
    """Submit the TaskRequest in TASK_FILE (YAML or JSON).

    Example: tracetap rollout submit task.yaml --wait
    """
    from tracetap.rollout.client import RolloutError
    from tracetap.rollout.task_files import TaskFileError, load_task

    client = _client(server)
    try:
        result = client.submit(load_task(task_file))
        if wait:
            result = client.wait(result.task_id, None if as_json else _progress_printer())
    except (TaskFileError, RolloutError) as exc:
        _fail(exc)
    finally:
        client.close()
    _show(result, as_json)


def _show(result, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result.model_dump(mode="json")))
        return
    click.echo(f"task {result.task_id}: {result.status} ({len(result.session_ids)} sessions)")
    for r in result.results:
        click.echo(f"  {r.session_id}  {r.status:<10} reward={r.reward}  traces={r.traces}"
                   + (f"  {r.error}" if r.error else ""))
    if result.callback is not None:
        cb = result.callback
        click.echo(f"callback: {cb.status} after {cb.attempts} attempt(s)"
                   + (f", last at {cb.last_attempt_at:%Y-%m-%d %H:%M:%S}Z" if cb.last_attempt_at else "")
                   + (f"; last error: {cb.last_error}" if cb.last_error else ""))


@command.command()
@click.argument("task_id", required=False)
@server_option
@click.option("--json", "as_json", is_flag=True)
def status(task_id: str | None, server: str, as_json: bool) -> None:
    """Nodes and their stage depths, and running tasks; with TASK_ID, that task's result and callback."""
    from tracetap.rollout.client import RolloutError

    client = _client(server)
    try:
        body = client.task(task_id) if task_id else client.status()
    except RolloutError as exc:
        _fail(exc)
    finally:
        client.close()
    if task_id:
        _show(body, as_json)
    elif as_json:
        click.echo(json.dumps(body))
    else:
        _show_nodes(body)


def _show_nodes(body: dict) -> None:
    for node in body["nodes"]:
        click.echo(f"{node['node_id']}: init {node['init_queue_depth']}+{node['init_inflight']}  "
                   f"ready {node['ready_depth']}  run {node['run_inflight']}/{node['max_run_workers']}  "
                   f"postrun {node['postrun_queue_depth']}+{node['postrun_inflight']}")
    click.echo(f"running tasks: {', '.join(body['running_tasks']) or 'none'}")


@command.command()
@click.argument("task_id")
@server_option
def cancel(task_id: str, server: str) -> None:
    """Cancel a running task: its sessions end CANCELLED."""
    from tracetap.rollout.client import RolloutError

    client = _client(server)
    try:
        result = client.cancel(task_id)
    except RolloutError as exc:
        _fail(exc)
    finally:
        client.close()
    click.echo(f"task {result.task_id}: cancel requested ({len(result.session_ids)} sessions)")
