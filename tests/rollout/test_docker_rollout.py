"""Acceptance: claude_code from `tracetap image build` in Docker, 4 samples through the rollout server."""

from __future__ import annotations

import cli_sessions
import docker
import httpx
import live
import pytest
from docker_daemon import image_tag
from test_rollout_server import wait_done
from tracetap.rollout.callbacks import LocalReceiver
from tracetap.rollout.harnesses import CLI_HARNESSES
from tracetap.rollout.harnesses.script import GATEWAY_ARGS, write_script
from tracetap.rollout.node import GatewayNode, NodeConfig
from tracetap.rollout.server import BackgroundServer, create_app

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def claude_image(image_build) -> str:
    return image_tag(image_build("--harness", "claude_code"))


def task_containers(task_id: str) -> list:
    client = docker.from_env()
    try:
        return client.containers.list(all=True, filters={"label": f"tracetap.task={task_id}"})
    finally:
        client.close()


def test_four_claude_code_samples_in_docker_end_rewarded_by_callback(claude_image: str, tmp_path) -> None:
    script = write_script(tmp_path / "script.jsonl", CLI_HARNESSES["claude_code"], [cli_sessions.COMMAND],
                          cli_sessions.FINAL)
    task = {"task_id": "docker-four", "instruction": cli_sessions.PROMPT, "num_samples": 4, "timeout_seconds": 240,
            "agent": {"harness": "claude_code"}, "runtime": {"backend": "docker", "image": claude_image},
            "evaluator": {"name": "session_completed"}}
    with live.start_gateway(tmp_path / "store", "--script", str(script), *GATEWAY_ARGS) as gw:
        nodes = lambda: [GatewayNode(NodeConfig(store=gw.store, sessions_root=tmp_path / "sessions",  # noqa: E731
                                                gateway_url=gw.url, node_id="dn0", run_workers=4))]
        server, receiver = BackgroundServer(create_app(gw.store, nodes)), LocalReceiver()
        server.start()
        try:
            with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as client:
                accepted = client.post("/tasks", json={**task, "callback_url": receiver.url}).json()
                done = wait_done(client, "/tasks/docker-four", timeout=400)
            receiver.arrived.wait(30)
        finally:
            receiver.close()
            server.stop()
    assert [r["status"] for r in done["results"]] == ["COMPLETED"] * 4, [r["error"] for r in done["results"]]
    assert [r["reward"] for r in done["results"]] == [1.0] * 4
    assert len(receiver.bodies) == 1
    assert sorted(r["session_id"] for r in receiver.bodies[0]["results"]) == sorted(accepted["session_ids"])
    for sid in accepted["session_ids"]:
        assert (tmp_path / "sessions" / sid / "workspace" / "proof.txt").read_text().strip() == cli_sessions.PROOF
    assert task_containers("docker-four") == []
