"""`tracetap rollout serve | submit | status | cancel`: the rollout server and a client for it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from tracetap.common import listen_address

DEFAULT_SERVER = "http://127.0.0.1:8788"
STAGES = ("init_queue_depth", "init_inflight", "ready_depth", "run_inflight", "postrun_queue_depth",
          "postrun_inflight")


@click.group("rollout")
def command() -> None:
    """Run TaskRequests as harness sessions and get rewarded trajectories back."""


@command.command("serve")
@click.option("--store", default=Path("rollout-store"), show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="Store directory (created when missing).")
@click.option("--listen", default="127.0.0.1:8788", show_default=True, callback=listen_address,
              help="HOST:PORT of the rollout server.")
@click.option("--upstream", default="local", show_default=True,
              help="Engine base URL for the nodes' gateway, or 'local' for the embedded engine.")
@click.option("--script", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Scripted mode for the embedded engine (JSONL of assistant messages per session).")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Gateway nodes.")
@click.option("--ray", "ray_address", default=None, metavar="ADDR",
              help="Run each node as a Ray actor on the cluster at ADDR (e.g. auto or ray://host:10001).")
@click.option("--init-workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--run-workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--postrun-workers", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--gateway-arg", "gateway_args", multiple=True, metavar="ARG",
              help="Extra argument for the nodes' `tracetap gateway` (repeatable), e.g. --max-model-len=40960.")
def serve(store: Path, listen: tuple[str, int], upstream: str, script: Path | None, nodes: int,
          ray_address: str | None, init_workers: int, run_workers: int, postrun_workers: int,
          gateway_args: tuple[str, ...]) -> None:
    """Serve the rollout API until Ctrl-C / SIGTERM."""
    import uvicorn

    from tracetap.rollout.nodes import ClusterConfig
    from tracetap.rollout.server import create_app

    args = (*(["--upstream", upstream] if upstream != "local" else []),
            *(["--script", str(script)] if script else []), *gateway_args)
    cluster = ClusterConfig(store=store, nodes=nodes, init_workers=init_workers, run_workers=run_workers,
                            postrun_workers=postrun_workers, gateway_args=args)
    app = create_app(_managed(cluster, ray_address))
    click.echo(f"tracetap rollout server on http://{listen[0]}:{listen[1]} (store {store}, {nodes} node(s))")
    uvicorn.run(app, host=listen[0], port=listen[1], log_level="warning")


def _managed(cluster: Any, ray_address: str | None) -> Any:
    from tracetap.rollout.nodes import local_manager

    if ray_address is None:
        return lambda: local_manager(cluster)
    try:
        from tracetap.rollout.ray_nodes import ray_manager
    except ImportError as exc:
        raise click.ClickException(f"--ray needs the ray extra (pip install 'tracetap[ray]'): {exc}") from None
    return lambda: ray_manager(cluster, ray_address)


@command.command("submit")
@click.argument("task_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--server", default=DEFAULT_SERVER, show_default=True, help="Rollout server URL.")
@click.option("--wait", is_flag=True, help="Wait until the task ends, showing its sessions per stage.")
@click.option("--json", "as_json", is_flag=True, help="Print the server's answer (the TaskResult with --wait) as JSON.")
def submit(task_file: Path, server: str, wait: bool, as_json: bool) -> None:
    """Submit TASK_FILE (YAML or JSON): a TaskRequest."""
    from tracetap.rollout.models import TaskRequest

    body = _load_task(task_file)
    _check(TaskRequest, body)
    answer = _call("POST", f"{server}/tasks", body)
    if wait:
        answer = _watch(server, answer["task_id"], quiet=as_json)
    click.echo(json.dumps(answer, indent=2) if as_json else _summary(answer))


@command.command("status")
@click.option("--server", default=DEFAULT_SERVER, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def status(server: str, as_json: bool) -> None:
    """Nodes and their stage depths."""
    answer = _call("GET", f"{server}/status")
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    for node in answer["nodes"]:
        click.echo(f"{node['node_id']}: " + "  ".join(f"{s}={node[s]}" for s in STAGES))
    click.echo(f"tasks running: {answer['tasks']['running']}")


@command.command("cancel")
@click.argument("task_id")
@click.option("--server", default=DEFAULT_SERVER, show_default=True)
def cancel(task_id: str, server: str) -> None:
    """Cancel a task: its sessions are torn down and end CANCELLED."""
    _call("DELETE", f"{server}/tasks/{task_id}")
    click.echo(f"cancelling {task_id}")


def _load_task(path: Path) -> dict:
    import yaml

    try:
        body = yaml.safe_load(path.read_text())  # JSON is YAML too
    except yaml.YAMLError as exc:
        raise click.ClickException(f"{path} is not valid YAML or JSON: {exc}") from None
    if not isinstance(body, dict):
        raise click.ClickException(f"{path} must hold one TaskRequest object, not {type(body).__name__}")
    return body


def _check(model: Any, body: dict) -> None:
    import pydantic

    try:
        model.model_validate(body)
    except pydantic.ValidationError as exc:
        lines = [f"  {'.'.join(map(str, e['loc'])) or '(task)'}: {e['msg']}" for e in exc.errors()]
        raise click.ClickException("invalid task:\n" + "\n".join(lines)) from None


def _call(method: str, url: str, body: dict | None = None) -> dict:
    import httpx

    try:
        reply = httpx.request(method, url, json=body, timeout=60, trust_env=False)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"the rollout server at {url} is unreachable: {exc}") from None
    if reply.status_code >= 400:
        raise click.ClickException(f"{method} {url}: {reply.status_code} {reply.text}")
    return reply.json()


def _watch(server: str, task_id: str, quiet: bool) -> dict:
    """Poll until the task ends; one line per change: sessions per stage."""
    shown = None
    while True:
        result = _call("GET", f"{server}/tasks/{task_id}")
        line = _stage_line(server, result)
        if line != shown and not quiet:
            click.echo(line, err=True)
            shown = line
        if result["status"] != "running":
            return result
        time.sleep(0.5)


def _stage_line(server: str, result: dict) -> str:
    ended = {r["session_id"]: r["status"] for r in result["results"]}
    counts: dict[str, int] = {}
    for sid in result["session_ids"]:
        stage = ended.get(sid) or _call("GET", f"{server}/sessions/{sid}")["status"]
        counts[stage] = counts.get(stage, 0) + 1
    return f"{result['task_id']}: " + "  ".join(f"{k}={v}" for k, v in sorted(counts.items()))


def _summary(answer: dict) -> str:
    if "results" not in answer:
        return f"submitted {answer['task_id']}: {len(answer['session_ids'])} session(s)"
    lines = [f"{answer['task_id']}: {answer['status']}"]
    lines += [f"  {r['session_id']}  {r['status']:<10} reward={r['reward']}  {r['error'] or ''}"
              for r in answer["results"]]
    return "\n".join(lines)

