"""The docker runtime against a real dockerd: exec, timeout kill, uploads, labels, teardown and sweep."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import urlsplit

import docker
import pytest
from docker_daemon import labelled
from tracetap.rollout.images.rootfs import ensure_rootfs
from tracetap.rollout.models import RuntimeSpec, SessionContext, SessionStatus, TaskRequest, new_session_id
from tracetap.rollout.node import GatewayNode, NodeConfig
from tracetap.rollout.runtimes import NodeRuntimes
from tracetap.rollout.runtimes.base import RuntimeUnavailable

pytestmark = pytest.mark.docker
SID = "sk-tap-docker-1"
IMAGE = ""  # set by the `image` fixture
LIST_SLEEPS = r"for p in /proc/[0-9]*; do tr '\0' ' ' <$p/cmdline; echo; done | grep -c '^sleep 300' || true"


@pytest.fixture(scope="module", autouse=True)
def image(docker_host: str, images_cache: Path) -> str:
    """The debootstrap minbase image `tracetap image build` starts from (cached across runs)."""
    global IMAGE
    client = docker.from_env()
    try:
        IMAGE = ensure_rootfs(client, images_cache, lambda line: None)
    finally:
        client.close()
    return IMAGE


def containers(node_id: str) -> list:
    return labelled(f"tracetap.node={node_id}")


async def session(tmp_path: Path, node_id: str, scenario, gateway: str = "http://127.0.0.1:9/",
                  backend: str = "docker", **spec):
    node = NodeRuntimes(node_id, tmp_path)
    await node.start(gateway)
    try:
        spec.setdefault("network", "host")
        spec.setdefault("image", IMAGE)
        runtime, url = await node.create(RuntimeSpec(backend=backend, **spec), SID, "task-1")
        await runtime.start()
        try:
            return await scenario(runtime, url) if spec["network"] == "gateway" else await scenario(runtime)
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


async def hang_past_a_timeout(runtime) -> tuple:
    """A command (with a background child in its group) out of time, then how many of its sleeps are left."""
    result = await runtime.exec("(sleep 300 &); sleep 300", env={}, log_name="hang", timeout=1)
    ps = await runtime.exec(LIST_SLEEPS, env={}, log_name="ps")
    return result, ps.stdout_path.read_text().split()


def test_timeout_kills_the_command_group(docker_host: str, tmp_path: Path) -> None:
    result, counts = asyncio.run(session(tmp_path, "node-timeout", hang_past_a_timeout))
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
        read = [await runtime.read_text(path) for path in ("repo/sub/a.txt", "/etc/tracetap.conf")]
        for missing in ("/etc/none.conf", "repo/none.txt"):
            with pytest.raises(FileNotFoundError):
                await runtime.read_text(missing)
        return out.stdout_path.read_text(), read

    assert asyncio.run(session(tmp_path / "s", "node-upload", scenario)) == ("AAconf", ["A", "conf"])
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


async def greeter(host: str, word: bytes) -> asyncio.Server:
    async def answer(reader, writer):
        writer.write(word)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, host, 0)


def fetch(host: str, port: int) -> str:
    return f"timeout 3 bash -c 'exec 3<>/dev/tcp/{host}/{port}; cat <&3' || echo unreachable"


async def beside_a_stranger(run):
    """`run(gateway_url, stranger_port)` while a gateway listens on 127.0.0.1 and a second server on every
    interface (what a confined container must not reach)."""
    gateway, stranger = await greeter("127.0.0.1", b"gateway"), await greeter("0.0.0.0", b"stranger")
    try:
        port = gateway.sockets[0].getsockname()[1]
        return await run(f"http://127.0.0.1:{port}/v1", stranger.sockets[0].getsockname()[1])
    finally:
        gateway.close()
        stranger.close()


async def probe_outputs(runtime, probes: list[str]) -> list[str]:
    return [(await runtime.exec(probe, env={}, log_name=f"p{n}")).stdout_path.read_text()
            for n, probe in enumerate(probes)]


def test_gateway_network_reaches_only_the_gateway(docker_host: str, tmp_path: Path) -> None:
    async def probe(gateway_url: str, other: int):
        async def scenario(runtime, url):
            link = urlsplit(url)
            probes = [fetch(link.hostname, link.port), fetch(link.hostname, other), fetch("127.0.0.1", other)]
            routes = (await runtime.exec("tail -n +2 /proc/net/route", env={}, log_name="routes")).stdout_path
            return link.hostname, await probe_outputs(runtime, probes), routes.read_text().splitlines()

        return await session(tmp_path, "node-net", scenario, gateway_url, network="gateway")

    link_ip, outputs, routes = asyncio.run(beside_a_stranger(probe))
    assert outputs[0].strip() == "gateway"
    assert outputs[1].strip() == outputs[2].strip() == "unreachable"
    assert len(routes) == 1  # one route, to the link address, no default
    destination = routes[0].split()[1]
    assert ".".join(str(int(destination[i:i + 2], 16)) for i in (6, 4, 2, 0)) == link_ip


CRASHING_NODE = textwrap.dedent("""
    import asyncio, sys
    from tracetap.rollout.models import RuntimeSpec
    from tracetap.rollout.runtimes import NodeRuntimes

    async def main():  # argv: sessions root, image, ready file, backend, node id
        node = NodeRuntimes(sys.argv[5], sys.argv[1])
        await node.start("http://127.0.0.1:9/")
        runtime, _ = await node.create(RuntimeSpec(backend=sys.argv[4], image=sys.argv[2], network="host"),
                                       "sk-tap-crash-1", "t")
        await runtime.start()
        open(sys.argv[3], "w").close()
        await asyncio.sleep(600)

    asyncio.run(main())
""")


def crash_a_node(sessions_root: Path, image: str, backend: str, node_id: str) -> None:
    """A node process that started one container, killed with SIGKILL (it cleans nothing up)."""
    ready = sessions_root.parent / f"{node_id}.ready"
    child = subprocess.Popen([sys.executable, "-c", CRASHING_NODE, str(sessions_root), image, str(ready), backend,
                              node_id])
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists(), f"the node never started its container (exit {child.poll()})"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)


def check_sweep_after_crash(sessions_root: Path, image: str, backend: str, node_id: str, listed) -> None:
    """A killed node leaves its container (`listed(node_id)` finds it); a new node with its id removes it."""
    crash_a_node(sessions_root, image, backend, node_id)
    assert len(listed(node_id)) == 1

    async def restart():
        node = NodeRuntimes(node_id, sessions_root)
        await node.start("http://127.0.0.1:9/")
        await node.close()

    asyncio.run(restart())
    assert listed(node_id) == []


def test_a_new_node_sweeps_what_a_killed_node_left(docker_host: str, tmp_path: Path) -> None:
    check_sweep_after_crash(tmp_path / "node", IMAGE, "docker", "node-crash", containers)


def test_a_hanging_harness_is_killed_at_the_budget_and_its_container_removed(gw, tmp_path: Path) -> None:
    task = TaskRequest.model_validate({"task_id": "docker-hang", "instruction": "x", "timeout_seconds": 3,
                                       "agent": {"harness": "shell", "settings": {"command": "sleep 300"}},
                                       "runtime": {"backend": "docker", "image": IMAGE}})
    node = GatewayNode(NodeConfig(store=gw.store, sessions_root=tmp_path, gateway_url=gw.url, node_id="node-hang"))

    async def scenario():
        try:
            return await node.run_session(SessionContext(session_id=new_session_id(), task=task))
        finally:
            await node.shutdown()

    result = asyncio.run(scenario())
    assert result.status == SessionStatus.TIMEOUT, result.error
    assert containers("node-hang") == []
