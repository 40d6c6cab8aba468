"""The rollout server over HTTP: real uvicorn, real nodes on a real scripted gateway, real callback receiver."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import httpx
import live
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner
from conftest import DEMO, PYTHON
from live import wait_done
from tracetap.rollout.callbacks import LocalReceiver
from tracetap.rollout.node import GatewayNode, NodeConfig
from tracetap.rollout.server import BackgroundServer, create_app
from tracetap.store import read_task

from tracetap.cli import cli as main_cli
from tracetap.launch import free_port

TEST_COMMAND = f"{PYTHON} -m pytest -v -p no:cacheprovider"
EXPECTED = {"test_calc.py::test_add": "PASSED", "test_calc.py::test_mul": "PASSED"}
ONE_CALL = (f"{PYTHON} -c 'from openai import OpenAI\n"
            "OpenAI(max_retries=0).chat.completions.create(model=\"m\", messages=[{\"role\": \"user\", "
            "\"content\": \"hi\"}])'")


def start_server(gw, sessions: Path) -> BackgroundServer:
    nodes = lambda: [GatewayNode(NodeConfig(store=gw.store, sessions_root=sessions, gateway_url=gw.url,  # noqa: E731
                                            node_id=f"n{i}", run_workers=2)) for i in range(2)]
    server = BackgroundServer(create_app(gw.store, nodes))
    server.start()
    return server


@pytest.fixture(scope="module")
def server(gw, tmp_path_factory):
    server = start_server(gw, tmp_path_factory.mktemp("sessions"))
    yield server
    server.stop()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30, trust_env=False, headers=live.control_headers()) as client:
        yield client


def fix_calc(task_id: str, **fields) -> dict:
    return {"task_id": task_id, "instruction": "Fix the failing test.", "num_samples": 4, "timeout_seconds": 120,
            "agent": {"harness": "builtin", "settings": {"max_turns": 8}},
            "runtime": {"prepare": [{"type": "upload_dir", "source": str(DEMO / "project"), "target": "."}]},
            "evaluator": {"name": "test_on_output", "config": {"test_command": TEST_COMMAND, "expected": EXPECTED}},
            **fields}


def shell_task(task_id: str, command: str, **fields) -> dict:
    return {"task_id": task_id, "instruction": "x", "agent": {"harness": "shell", "settings": {"command": command}},
            **fields}


def test_four_samples_over_http_end_completed_with_one_callback(client, gw):
    client.post("/tasks", json=shell_task("other-task", ONE_CALL))  # its traces must stay out of the samples
    assert wait_done(client, "/tasks/other-task")["status"] == "completed"
    receiver = LocalReceiver()
    try:
        accepted = client.post("/tasks", json=fix_calc("http-four", callback_url=receiver.url)).json()
        assert accepted["status"] == "running" and len(accepted["session_ids"]) == 4
        done = wait_done(client, "/tasks/http-four")
        receiver.arrived.wait(30)
        time.sleep(1.0)  # a second delivery would arrive by now
    finally:
        receiver.close()
    assert done["status"] == "completed"
    assert [r["status"] for r in done["results"]] == ["COMPLETED"] * 4, [r["error"] for r in done["results"]]
    assert [r["reward"] for r in done["results"]] == [1.0] * 4
    assert {r["node_id"] for r in done["results"]} == {"n0", "n1"}  # spread by stage pressure
    assert len(receiver.bodies) == 1
    assert receiver.bodies[0]["task_id"] == "http-four"
    assert sorted(r["session_id"] for r in receiver.bodies[0]["results"]) == sorted(accepted["session_ids"])
    session = client.get(f"/sessions/{accepted['session_ids'][0]}").json()
    assert session["status"] == "COMPLETED" and session["traces"] == 5

    samples = client.get("/tasks/http-four/samples", params={"format": "parquet"})
    assert samples.status_code == 200
    table = pq.read_table(io.BytesIO(samples.content))
    assert set(table.column("session_id").to_pylist()) == set(accepted["session_ids"])
    assert set(table.column("reward").to_pylist()) == {1.0}


@pytest.mark.parametrize("change, field", [
    ({"num_samples": 0}, "num_samples"),
    ({"agent": {"harness": "nope"}}, "harness"),
    ({"builder": "nope"}, "builder"),
    ({"evaluator": {"name": "nope"}}, "evaluator"),
    ({"evaluator": {"name": "harbor", "config": {"tests_dir": "/nonexistent/tests"}}}, "evaluator"),
    ({"evaluator": {"name": "swebench", "config": {"instance": {"instance_id": "x"}}}}, "evaluator"),
])
def test_invalid_task_is_a_422_naming_the_field_and_creates_nothing(client, gw, change, field):
    reply = client.post("/tasks", json={**shell_task("bad-task", "true"), **change})
    assert reply.status_code == 422
    assert any(field in ".".join(map(str, error["loc"])) for error in reply.json()["detail"]), reply.json()
    assert read_task(gw.store, "bad-task") is None
    assert client.get("/tasks/bad-task").status_code == 404


def test_running_task_id_is_a_409_and_delete_cancels_it(client, gw):
    body = shell_task("long-one", "sleep 60", num_samples=2)
    first = client.post("/tasks", json=body).json()
    before = read_task(gw.store, "long-one")
    again = client.post("/tasks", json=body)
    assert again.status_code == 409
    assert read_task(gw.store, "long-one") == before  # the rejected one changed nothing
    cancelled = client.delete("/tasks/long-one")
    assert cancelled.status_code == 200
    done = wait_done(client, "/tasks/long-one", timeout=30)
    assert done["status"] == "cancelled"
    assert {r["status"] for r in done["results"]} == {"CANCELLED"}
    assert sorted(r["session_id"] for r in done["results"]) == sorted(first["session_ids"])


def test_restarted_server_answers_for_a_finished_task(gw, tmp_path):
    first = start_server(gw, tmp_path / "sessions")
    try:
        with httpx.Client(base_url=first.url, timeout=30, trust_env=False, headers=live.control_headers()) as client:
            client.post("/tasks", json=shell_task("before-restart", ONE_CALL))
            done = wait_done(client, "/tasks/before-restart")
    finally:
        first.stop()
    second = start_server(gw, tmp_path / "sessions")
    try:
        with httpx.Client(base_url=second.url, timeout=30, trust_env=False) as client:
            again = client.get("/tasks/before-restart").json()
    finally:
        second.stop()
    assert done["status"] == "completed" and done["results"][0]["status"] == "COMPLETED"
    assert again == done


def test_reference_shaped_request_goes_through_its_routes(client):
    body = {"task_id": "ref-shape", "instruction": "say hi", "num_samples": 2, "timeout_seconds": 60,
            "agent": {"harness": "shell", "custom_shell": ONE_CALL}, "evaluator": "session_completed"}
    accepted = client.post("/rollout/task/submit", json=body)
    assert accepted.status_code == 200
    assert set(accepted.json()) == {"task_id", "status", "results", "result_paths"}
    done = wait_done(client, "/rollout/task/ref-shape")
    assert done["status"] == "completed"
    assert [r["status"] for r in done["results"]] == ["COMPLETED"] * 2
    assert all(r["reward"] == 1.0 for r in done["results"])
    assert (Path(done["result_paths"][0]) / "_delta_log").is_dir()  # the rollouts table holding the task
    status = client.get("/rollout/status").json()
    assert {node["node_id"] for node in status["nodes"]} == {"n0", "n1"}
    bad = client.post("/rollout/task/submit", json={**body, "task_id": "ref-bad", "num_samples": 0})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "num_samples"


def cli(*args: str):
    return CliRunner().invoke(main_cli, ["rollout", *args])


def test_cli_submits_a_yaml_task_and_waits(server, gw, tmp_path):
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(shell_task("cli-yaml", ONE_CALL, num_samples=2)))
    done = cli("submit", str(path), "--server", server.url, "--wait", "--json")
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert result["status"] == "completed" and [r["status"] for r in result["results"]] == ["COMPLETED"] * 2
    shown = cli("status", "--server", server.url, "--json")
    assert {node["node_id"] for node in json.loads(shown.stdout)["nodes"]} == {"n0", "n1"}


@pytest.mark.parametrize("text, message", [
    ("task_id: [unclosed\n", "not valid YAML"),
    (json.dumps(shell_task("cli-bad", "true", num_samples=0)), "num_samples"),
    (json.dumps({**shell_task("cli-bad", "true"), "agent": {"harness": "nope"}}), "agent.harness"),
])
def test_cli_refuses_a_bad_task_file_naming_the_problem(server, gw, tmp_path, text, message):
    path = tmp_path / "task.yaml"
    path.write_text(text)
    done = cli("submit", str(path), "--server", server.url)
    assert done.exit_code != 0 and message in done.output, done.output
    assert read_task(gw.store, "cli-bad") is None


def test_cli_cancel_and_ray_without_a_cluster(server, tmp_path, monkeypatch):
    path = tmp_path / "task.json"
    path.write_text(json.dumps(shell_task("cli-cancel", "sleep 60")))
    assert cli("submit", str(path), "--server", server.url).exit_code == 0
    assert cli("cancel", "cli-cancel", "--server", server.url).exit_code == 0
    with httpx.Client(base_url=server.url, trust_env=False, headers=live.control_headers()) as client:
        assert wait_done(client, "/tasks/cli-cancel", timeout=30)["status"] == "cancelled"
    unknown = cli("cancel", "never-was", "--server", server.url)
    assert unknown.exit_code != 0 and "404" in unknown.output
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray = cli("serve", "--ray", "auto", "--store", str(tmp_path / "s"))
    assert ray.exit_code != 0 and "no Ray cluster at 'auto'" in ray.output, ray.output
    nobody = f"127.0.0.1:{free_port()}"  # nothing listens there: an error at once, not minutes of retries
    ray = cli("serve", "--ray", nobody, "--store", str(tmp_path / "s"))
    assert ray.exit_code != 0 and f"no Ray cluster answers at '{nobody}'" in ray.output, ray.output
    monkeypatch.setenv("RAY_ADDRESS", nobody)  # a stale address: `auto` resolves to it and fails as fast
    ray = cli("serve", "--ray", "auto", "--store", str(tmp_path / "s"))
    assert ray.exit_code != 0 and f"no Ray cluster answers at '{nobody}'" in ray.output, ray.output
