"""The docker runtime against a real dockerd: exec, timeout kill, uploads, labels, teardown and sweep."""

from __future__ import annotations

import asyncio
from pathlib import Path

import docker
import pytest
from tracetap.rollout.models import RuntimeSpec
from tracetap.rollout.runtimes import NodeRuntimes
from tracetap.rollout.runtimes.base import RuntimeUnavailable

pytestmark = pytest.mark.docker
IMAGE = "tracetap-test/python:bookworm"  # debootstrap minbase + python3, built by the image tests' cache
SID = "sk-tap-docker-1"
LIST_SLEEPS = r"for p in /proc/[0-9]*; do tr '\0' ' ' <$p/cmdline; echo; done | grep -c '^sleep 300' || true"


def containers(node_id: str) -> list:
    client = docker.from_env()
    try:
        return client.containers.list(all=True, filters={"label": f"tracetap.node={node_id}"})
    finally:
        client.close()


async def session(tmp_path: Path, node_id: str, scenario, **spec):
    node = NodeRuntimes(node_id, tmp_path)
    await node.start("http://127.0.0.1:9/")
    try:
        runtime, _ = await node.create(RuntimeSpec(backend="docker", image=IMAGE, network="host", **spec),
                                       SID, "task-1")
        await runtime.start()
        try:
            return await scenario(runtime)
        finally:
            await runtime.teardown()
    finally:
        await node.close()


def test_exec_env_cwd_logs_and_labels(docker_host: str, tmp_path: Path) -> None:
    async def scenario(runtime):
        labels = containers("node-exec")[0].labels
        result = await runtime.exec("pwd; echo $GIVEN; echo oops >&2; exit 3", env={"GIVEN": "yes"},
                                    log_name="agent/step")
        return labels, result

    labels, result = asyncio.run(session(tmp_path, "node-exec", scenario))
    assert labels["tracetap.session"] == SID and labels["tracetap.task"] == "task-1"
    assert result.returncode == 3
    assert result.stdout_path == tmp_path.resolve() / SID / "logs" / "agent" / "step.stdout.log"
    assert result.stdout_path.read_text().split() == ["/tracetap/session/workspace", "yes"]
    assert result.stderr_path.read_text() == "oops\n"
    assert containers("node-exec") == []


def test_timeout_kills_the_command_group(docker_host: str, tmp_path: Path) -> None:
    async def scenario(runtime):
        result = await runtime.exec("(sleep 300 &); sleep 300", env={}, log_name="hang", timeout=1)
        ps = await runtime.exec(LIST_SLEEPS, env={}, log_name="ps")
        return result, ps.stdout_path.read_text().split()

    result, counts = asyncio.run(session(tmp_path, "node-timeout", scenario))
    assert result.timed_out
    assert counts[-1] == "0"  # no sleep left, not even the one the command put in the background group


def test_uploads_inside_and_outside_the_mount(docker_host: str, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "a.txt").write_text("A")

    async def scenario(runtime):
        await runtime.upload(source, "repo")
        await runtime.upload(source / "sub" / "a.txt", "/opt/x/a.txt")
        await runtime.write_text("/etc/tracetap.conf", "conf")
        out = await runtime.exec("cat repo/sub/a.txt /opt/x/a.txt /etc/tracetap.conf", env={}, log_name="cat")
        return out.stdout_path.read_text()

    assert asyncio.run(session(tmp_path / "s", "node-upload", scenario)) == "AAconf"
    assert (tmp_path / "s" / SID / "workspace" / "repo" / "sub" / "a.txt").read_text() == "A"


def test_missing_image_is_a_clear_error(docker_host: str, tmp_path: Path) -> None:
    async def scenario():
        node = NodeRuntimes("node-missing", tmp_path)
        await node.start("http://127.0.0.1:9/")
        try:
            runtime, _ = await node.create(RuntimeSpec(backend="docker", image="tracetap-none:nope",
                                                       network="host"), SID, "t")
            await runtime.start()
        finally:
            await node.close()

    with pytest.raises(RuntimeUnavailable, match="tracetap-none:nope"):
        asyncio.run(scenario())
