"""Evaluators in containers: a Harbor task and the SWE-bench-format task set, through a node with Docker.

The task images are built here FROM the debootstrap rootfs (git, python3, pytest, patch), cached by tag.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import docker
import pytest
from click.testing import CliRunner
from conftest import run, samples
from docker_daemon import labelled
from swebench_set import make_task_set
from test_node import node_for, run_all
from tracetap.rollout.harbor import harbor_task_request
from tracetap.rollout.images.rootfs import ensure_rootfs
from tracetap.rollout.images.task import build_task_image
from tracetap.rollout.models import SessionStatus, TaskRequest
from tracetap.rollout.swebench import swebench_task_request

from tracetap.cli import cli

pytestmark = pytest.mark.docker
HARBOR_TASK = Path(__file__).resolve().parents[1] / "fixtures" / "harbor" / "hello-world"
GREET = ("if [ \"$SAMPLE_INDEX\" = 0 ]; then echo 'Hello, world!' > hello.txt; "
         "else echo 'Goodbye' > hello.txt; fi")
AGENT_SECONDS = 8  # the agent of calc-add works this long: its fresh runtime must be ready before it ends


@pytest.fixture(scope="module")
def client(docker_host: str):
    client = docker.from_env()
    yield client
    client.close()


@pytest.fixture(scope="module")
def base(client, images_cache: Path) -> str:
    return ensure_rootfs(client, images_cache, lambda line: None)


@pytest.fixture(scope="module")
def task_set(tmp_path_factory):
    return make_task_set(tmp_path_factory.mktemp("swebench-set"))


@pytest.fixture(scope="module")
def testbed_image(client, base, task_set) -> str:
    return build_task_image(task_set.context, base, client)


def shell(command: str) -> dict:
    return {"harness": "shell", "settings": {"command": command}}


def test_harbor_task_rewarded_from_its_verifier_with_its_logs_kept(gw, client, base, tmp_path):
    made = CliRunner().invoke(cli, ["task", "harbor", str(HARBOR_TASK), "--base-image", base, "--setting",
                                    f"command={GREET}", "--samples", "2"])
    assert made.exit_code == 0, made.output
    request = TaskRequest.model_validate_json(made.stdout).model_copy(update={"task_id": "evalrt-harbor"})
    assert request == harbor_task_request(HARBOR_TASK, base_image=base, agent=shell(GREET), client=client,
                                          task_id="evalrt-harbor", num_samples=2)
    assert request.runtime.workdir == "/app" and request.runtime.image.startswith("tracetap-task:")
    assert request.evaluator.config["env"] == {"EXPECTED": "Hello, world!"} and request.runtime.cpus == 1
    results = run(run_all(node_for(gw, tmp_path, node_id="evalrt-harbor-node"), samples(request)))

    assert [r.status for r in results] == [SessionStatus.COMPLETED] * 2, [r.error for r in results]
    assert [r.reward for r in results] == [1.0, 0.0]
    logs = [tmp_path / "sessions" / r.session_id / "logs" / "eval" for r in results]
    assert (logs[0] / "verifier.stdout.log").read_text() == "greeting found\n"
    assert (logs[1] / "verifier.stderr.log").read_text() == "no greeting in /app/hello.txt\n"
    assert json.loads((logs[0] / "reward.json").read_text()) == {"reward": 1.0, "greeting": 1}
    assert not (logs[0] / "reward.txt").exists()  # reward.json wins: reward.txt (0.5) is not read
    assert "eval/verifier.stdout.log" in results[0].logs
    assert labelled("tracetap.task=evalrt-harbor") == []


def swebench_request(instance: dict, image: str, command: str):
    return swebench_task_request(instance, image=image, agent=shell(command), timeout_seconds=240,
                                 task_id=f"evalrt-{instance['instance_id']}")


def test_swebench_task_set_in_containers(gw, client, testbed_image, task_set, tmp_path):
    by_id = {i["instance_id"]: i for i in task_set.instances}
    commands = dict(task_set.agent_commands, **{"calc-add": f"sleep {AGENT_SECONDS}; " +
                                                 task_set.agent_commands["calc-add"]})
    requests = [swebench_request(by_id[name], testbed_image, commands[name]) for name in by_id]
    nobase = {**by_id["calc-add"], "instance_id": "calc-nobase", "base_commit": "f" * 40}
    requests.append(swebench_request(nobase, testbed_image, "true"))
    node = node_for(gw, tmp_path, node_id="evalrt-swebench-node", run_workers=4, init_workers=4)
    results = run(run_all(node, [samples(request)[0] for request in requests]))
    resolved, broke, empty, missing = results

    assert [r.status for r in results[:3]] == [SessionStatus.COMPLETED] * 3, [r.error for r in results]
    assert [r.reward for r in results[:3]] == [1.0, 0.0, 0.0]
    line = resolved.timeline
    assert line["run_start"] <= line["eval_runtime_start"] < line["eval_runtime_ready"] < line["run_end"]
    reports = [json.loads((tmp_path / "sessions" / r.session_id / "logs" / "eval" / "report.json").read_text())
               for r in results[:3]]
    assert reports[0]["calc-add"]["resolution"] == "RESOLVED_FULL"
    assert reports[1]["calc-mul"]["tests_status"]["PASS_TO_PASS"]["failure"] == ["tests/test_calc.py::test_neg"]
    assert reports[2]["calc-sub"]["empty_generation"] is True
    assert missing.status is SessionStatus.ERROR
    assert f"base_commit {'f' * 40} does not exist in /testbed" in missing.error
    assert labelled("tracetap.node=evalrt-swebench-node") == []


def test_cancel_removes_the_fresh_runtime_too(gw, client, testbed_image, task_set, tmp_path):
    request = swebench_request(task_set.instances[0], testbed_image, "sleep 300")
    [ctx] = samples(request)
    node = node_for(gw, tmp_path, node_id="evalrt-cancel-node")
    ready = tmp_path / "sessions" / f"{ctx.session_id}-eval" / "logs" / "prepare.00.stdout.log"

    async def scenario():
        running = asyncio.ensure_future(node.run_session(ctx))
        while not ready.exists():
            await asyncio.sleep(0.1)
        labels = {c.labels["tracetap.session"] for c in labelled("tracetap.node=evalrt-cancel-node")}
        assert await node.cancel(ctx.session_id)
        result = await running
        await node.shutdown()
        return labels, result

    labels, result = run(scenario())
    assert labels == {ctx.session_id, f"{ctx.session_id}-eval"}
    assert result.status is SessionStatus.CANCELLED
    assert labelled("tracetap.node=evalrt-cancel-node") == []
