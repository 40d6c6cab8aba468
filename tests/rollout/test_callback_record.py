"""The callback's outcome is part of the task's record: persisted, served by `GET /tasks/{id}` and
`tracetap rollout status TASK_ID`, still known (and, while pending, still retried) after a restart."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import live
from click.testing import CliRunner
from tracetap.rollout.callbacks import LocalReceiver, RetryPolicy
from tracetap.rollout.node import GatewayNode, NodeConfig
from tracetap.rollout.server import BackgroundServer, create_app
from tracetap.store import read_task

from tracetap.cli import cli as main_cli
from tracetap.launch import free_port

QUICK = RetryPolicy(attempts=3, first_delay=0.05, timeout=5)
PATIENT = RetryPolicy(attempts=40, first_delay=0.05, timeout=5)  # retries for minutes: a restart comes first


@contextmanager
def served(gw, sessions: Path, policy: RetryPolicy) -> Iterator[httpx.Client]:
    nodes = lambda: [GatewayNode(NodeConfig(store=gw.store, sessions_root=sessions, gateway_url=gw.url))]  # noqa: E731
    with BackgroundServer(create_app(gw.store, nodes, policy)) as server, \
            httpx.Client(base_url=server.url, timeout=30, trust_env=False, headers=live.control_headers()) as client:
        yield client


def submit(client: httpx.Client, task_id: str, callback_url: str) -> None:
    body = {"task_id": task_id, "instruction": "x", "callback_url": callback_url,
            "agent": {"harness": "shell", "settings": {"command": "true"}}}
    assert client.post("/tasks", json=body).status_code == 200


def wait_for(client: httpx.Client, task_id: str, done, timeout: float = 60) -> dict:
    """The task's result once `done(result)` holds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        body = client.get(f"/tasks/{task_id}").json()
        if done(body):
            return body
        time.sleep(0.05)
    raise AssertionError(f"{task_id}: condition not met in {timeout}s: {body}")


def settled(body: dict) -> bool:
    return body["status"] != "running" and body["callback"]["status"] != "pending"


def stored(gw, task_id: str) -> dict:
    return read_task(gw.store, task_id)["result"]


def test_dead_receiver_is_recorded_as_failed_and_a_restart_still_says_so(gw, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/callback"  # nothing listens there
    with served(gw, tmp_path / "sessions", QUICK) as client:
        submit(client, "cb-dead", dead)
        first = wait_for(client, "cb-dead", settled)
    callback = first["callback"]
    assert first["status"] == "completed"
    assert (callback["status"], callback["attempts"]) == ("failed", 3)
    assert "ConnectError" in callback["last_error"] and callback["last_attempt_at"]
    assert stored(gw, "cb-dead")["callback"] == callback
    with served(gw, tmp_path / "sessions", QUICK) as client:
        assert client.get("/tasks/cb-dead").json()["callback"] == callback
        shown = CliRunner().invoke(main_cli, ["rollout", "status", "cb-dead", "--server", str(client.base_url)])
    assert shown.exit_code == 0, shown.output
    assert "callback: failed after 3 attempt(s)" in shown.output and "ConnectError" in shown.output


def test_live_receiver_is_recorded_as_delivered_once(gw, tmp_path):
    with LocalReceiver() as receiver:
        with served(gw, tmp_path / "sessions", QUICK) as client:
            submit(client, "cb-live", receiver.url)
            first = wait_for(client, "cb-live", settled)
        with served(gw, tmp_path / "sessions", QUICK) as client:
            again = client.get("/tasks/cb-live").json()
    callback = first["callback"]
    assert (callback["status"], callback["attempts"], callback["last_error"]) == ("delivered", 1, None)
    assert again["callback"] == stored(gw, "cb-live")["callback"] == callback
    assert len(receiver.bodies) == 1
    assert receiver.bodies[0]["task_id"] == "cb-live" and "callback" not in receiver.bodies[0]


def test_pending_callback_resumes_on_the_next_server(gw, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/callback"
    with served(gw, tmp_path / "sessions", PATIENT) as client:
        submit(client, "cb-later", url)
        pending = wait_for(client, "cb-later", lambda b: b["callback"] and b["callback"]["attempts"] >= 2)
    assert pending["callback"]["status"] == "pending"
    attempts = stored(gw, "cb-later")["callback"]["attempts"]
    assert attempts >= 2
    with LocalReceiver(port) as receiver, served(gw, tmp_path / "sessions", PATIENT) as client:
        done = wait_for(client, "cb-later", settled)
    assert done["callback"]["status"] == "delivered"
    assert done["callback"]["attempts"] == attempts + 1
    assert [body["task_id"] for body in receiver.bodies] == ["cb-later"]
