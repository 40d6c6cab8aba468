"""The rollout server over real HTTP: uvicorn, in-process nodes, one real gateway, a real callback receiver."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from conftest import DEMO, PYTHON
from tracetap.rollout.callbacks import Receiver
from tracetap.rollout.nodes import ClusterConfig, local_manager
from tracetap.rollout.server import ServerThread, create_app

from tracetap.cli import cli

TEST_COMMAND = f"{PYTHON} -m pytest -v -p no:cacheprovider"
EXPECTED = {"test_calc.py::test_add": "PASSED", "test_calc.py::test_mul": "PASSED"}


def start_server(store: Path, **config) -> ServerThread:
    cluster = ClusterConfig(store=store, sessions_root=store.parent / "sessions",
                            gateway_args=("--script", str(DEMO / "script.jsonl")), **config)
    return ServerThread(create_app(lambda: local_manager(cluster))).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollout-server")
    running = start_server(root / "store", nodes=2, run_workers=2)
    yield running
    running.stop()


@pytest.fixture
def receiver():
    with Receiver() as listening:
        yield listening


def fix_calc(task_id: str, **fields) -> dict:
    return {"task_id": task_id, "instruction": "Fix the failing test.", "timeout_seconds": 120,
            "agent": {"harness": "builtin", "settings": {"max_turns": 8}},
            "runtime": {"prepare": [{"type": "upload_dir", "source": str(DEMO / "project"), "target": "."}]},
            "evaluator": {"name": "test_on_output", "config": {"test_command": TEST_COMMAND, "expected": EXPECTED}},
            **fields}


def shell_task(task_id: str, command: str, **fields) -> dict:
    return {"task_id": task_id, "instruction": "run", "agent": {"harness": "shell", "settings": {"command": command}},
            **fields}


def wait_done(url: str, task_id: str, timeout: float = 240.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = httpx.get(f"{url}/tasks/{task_id}").json()
        if result["status"] != "running":
            return result
        time.sleep(0.25)
    raise AssertionError(f"task {task_id} still running after {timeout}s")


def store_of(server: ServerThread) -> Path:
    return server.server.config.app.state.manager.results.root


def test_four_samples_complete_with_one_callback(server, receiver):
    reply = httpx.post(f"{server.url}/tasks", json=fix_calc("four", num_samples=4, callback_url=receiver.url))
    assert reply.status_code == 202, reply.text
    sids = reply.json()["session_ids"]
    assert len(sids) == 4 and all(s.startswith("sk-tap-") for s in sids)

    result = wait_done(server.url, "four")
    assert result["status"] == "completed"
    assert [r["status"] for r in result["results"]] == ["COMPLETED"] * 4, [r["error"] for r in result["results"]]
    assert [r["reward"] for r in result["results"]] == [1.0] * 4
    assert {r["node_id"] for r in result["results"]} <= {"node-0", "node-1"}
    receiver.wait(10)
    time.sleep(0.5)  # a second delivery would have arrived by now
    assert len(receiver.bodies) == 1
    assert receiver.bodies[0]["task_id"] == "four"
    assert sorted(r["session_id"] for r in receiver.bodies[0]["results"]) == sorted(sids)

    listed = CliRunner().invoke(cli, ["sessions", "--store", str(store_of(server)), "--json"])
    rows = {row["session"]: row for row in json.loads(listed.output)}
    assert all(rows[s]["task"] == "four" and rows[s]["harness"] == "builtin" for s in sids)
    assert httpx.get(f"{server.url}/sessions/{sids[0]}").json()["status"] == "COMPLETED"


def test_samples_come_back_with_rewards_in_every_format(server):
    if httpx.get(f"{server.url}/tasks/four").status_code == 404:
        httpx.post(f"{server.url}/tasks", json=fix_calc("four", num_samples=4))
    wait_done(server.url, "four")
    lines = httpx.get(f"{server.url}/tasks/four/samples", params={"format": "jsonl"}).text.splitlines()
    rows = [json.loads(line) for line in lines]
    assert len({row["session_id"] for row in rows}) == 4
    assert all(row["reward"] == 1.0 for row in rows)
    parquet = httpx.get(f"{server.url}/tasks/four/samples", params={"format": "parquet"})
    assert parquet.status_code == 200 and parquet.content[:4] == b"PAR1"
    assert httpx.get(f"{server.url}/tasks/four/samples", params={"format": "csv"}).status_code == 422


@pytest.mark.parametrize(("change", "where"), [
    ({"num_samples": 0}, ["body", "num_samples"]),
    ({"agent": {"harness": "nope"}}, ["body", "agent", "harness"]),
    ({"builder": "nope"}, ["body", "builder"]),
    ({"evaluator": {"name": "nope"}}, ["body", "evaluator"]),
    ({"task_id": "../up"}, ["body", "task_id"]),
])
def test_invalid_tasks_are_422_with_the_field_and_create_nothing(server, change, where):
    before = sorted(p.name for p in (store_of(server) / "rollouts").glob("*"))
    reply = httpx.post(f"{server.url}/tasks", json={**shell_task("bad", "true"), **change})
    assert reply.status_code == 422
    assert [error["loc"][:len(where)] for error in reply.json()["detail"]] == [where]
    assert sorted(p.name for p in (store_of(server) / "rollouts").glob("*")) == before
    assert httpx.get(f"{server.url}/tasks/bad").status_code == 404


def test_a_running_task_id_is_a_409_and_cancel_ends_its_sessions(server):
    assert httpx.post(f"{server.url}/tasks", json=shell_task("slow", "sleep 60", num_samples=2)).status_code == 202
    assert httpx.post(f"{server.url}/tasks", json=shell_task("slow", "true")).status_code == 409
    time.sleep(1.0)
    assert httpx.delete(f"{server.url}/tasks/slow").status_code == 202
    result = wait_done(server.url, "slow", timeout=60)
    assert result["status"] == "cancelled"
    assert [r["status"] for r in result["results"]] == ["CANCELLED"] * 2
    assert httpx.delete(f"{server.url}/tasks/never").status_code == 404


def test_reference_shapes_go_through_its_routes(server):
    body = {"task_id": "ref", "instruction": "run", "num_samples": 2,
            "agent": {"harness": "shell", "custom_shell": "echo hi", "mcp_servers": []},
            "runtime": {"backend": "local", "gpus": 0}, "builder": "per_request",
            "evaluator": {"name": "session_completed", "env": {"A": "1"}}}
    reply = httpx.post(f"{server.url}/rollout/task/submit", json=body)
    assert reply.status_code == 200, reply.text
    deadline = time.monotonic() + 60
    while (task := httpx.get(f"{server.url}/rollout/task/ref").json())["status"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.25)
    assert task["status"] == "completed" and len(task["results"]) == 2
    assert set(task["results"][0]) >= {"session_id", "task_id", "status", "trajectory", "timing", "node_id",
                                       "error", "metadata"}
    assert set(task["results"][0]["timing"]) == {"register_to_init_queue_ms", "init_ms", "run_ms", "postrun_ms"}
    assert Path(task["result_paths"][0]).is_file()
    status = httpx.get(f"{server.url}/rollout/status").json()
    assert {node["node_id"] for node in status["nodes"]} == {"node-0", "node-1"}
    assert httpx.post(f"{server.url}/rollout/task/submit", json={**body, "num_samples": 0}).status_code == 422


def test_a_restarted_server_answers_for_finished_tasks(tmp_path):
    store = tmp_path / "store"
    with start_server(store) as first:
        httpx.post(f"{first.url}/tasks", json=shell_task("once", "true"))
        done = wait_done(first.url, "once", timeout=60)
    assert done["status"] == "completed"
    stored = json.loads((store / "rollouts" / "task_id=once" / "task.json").read_text())
    assert stored["result"]["status"] == "completed"
    with start_server(store) as second:
        assert httpx.get(f"{second.url}/tasks/once").json() == done


def test_cli_submits_yaml_waits_and_reports(server, tmp_path):
    task = tmp_path / "task.yaml"
    task.write_text("task_id: from-yaml\ninstruction: run\nnum_samples: 2\n"
                    "agent:\n  harness: shell\n  settings:\n    command: 'true'\n")
    done = CliRunner().invoke(cli, ["rollout", "submit", str(task), "--server", server.url, "--wait", "--json"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert result["status"] == "completed" and [r["status"] for r in result["results"]] == ["COMPLETED"] * 2
    status = CliRunner().invoke(cli, ["rollout", "status", "--server", server.url])
    assert status.exit_code == 0 and "node-0:" in status.output and "run_inflight=" in status.output


@pytest.mark.parametrize(("text", "message"), [
    ("task_id: [unclosed\n", "not valid YAML"),
    ("- a list\n", "must hold one TaskRequest"),
    ('{"task_id": "t", "instruction": "x", "num_samples": 0, "agent": {"harness": "shell"}}', "num_samples"),
    ('{"task_id": "t", "instruction": "x", "agent": {"harness": "nope"}}', "agent.harness"),
])
def test_cli_refuses_bad_task_files_naming_the_field(server, tmp_path, text, message):
    task = tmp_path / "task.json"
    task.write_text(text)
    done = CliRunner().invoke(cli, ["rollout", "submit", str(task), "--server", server.url])
    assert done.exit_code != 0 and message in done.output
    assert httpx.get(f"{server.url}/tasks/t").status_code == 404
