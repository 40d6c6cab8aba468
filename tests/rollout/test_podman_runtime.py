"""The podman runtime against rootless podman (scripts/podman.sh): its containers run as the unprivileged
user, reach their gateway through the socket link and nothing else, and are removed and swept by label."""

from __future__ import annotations

import asyncio
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import docker
import pytest
from docker_daemon import image_tag, labelled
from test_docker_runtime import (
    SID,
    beside_a_stranger,
    check_sweep_after_crash,
    fetch,
    hang_past_a_timeout,
    probe_outputs,
    session,
)
from tracetap.rollout.images.daemon import copy_image
from tracetap.rollout.images.rootfs import ensure_rootfs
from tracetap.rollout.models import SessionContext, SessionStatus, TaskRequest, new_session_id
from tracetap.rollout.node import GatewayNode, NodeConfig
from tracetap.rollout.runtimes.base import RuntimeUnavailable
from tracetap.rollout.runtimes.podman import podman_url
from tracetap.store import connect

pytestmark = pytest.mark.podman
USER = subprocess.run(["bash", str(Path(__file__).parents[2] / "scripts" / "podman.sh"), "user"],
                      capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def image(docker_host: str, podman_host: str, images_cache: Path) -> str:
    """The debootstrap rootfs, built in dockerd (cached) and loaded into the podman user's store."""
    source, target = docker.from_env(), docker.DockerClient(base_url=podman_host, timeout=1800)
    try:
        tag = ensure_rootfs(source, images_cache, lambda line: None)
        copy_image(source, target, tag)
    finally:
        source.close()
        target.close()
    return tag


@pytest.fixture
def roots() -> Path:
    """Sessions under a folder the podman user can search (pytest's own tmp root is private to root)."""
    root = Path(tempfile.mkdtemp(prefix="tracetap-podman-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)


def containers(node_id: str) -> list:
    return labelled(f"tracetap.node={node_id}", podman_url())


def host_uid(pid: int) -> int:
    """The real uid of a host process, from /proc/<pid>/status."""
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:"))
    return int(line.split()[1])


def test_exec_runs_as_the_unprivileged_user(image: str, roots: Path) -> None:
    async def scenario(runtime):
        container = containers("pm-exec")[0]
        container.reload()
        result = await runtime.exec("pwd; echo $GIVEN; id -u; echo oops >&2; touch made; exit 3",
                                    env={"GIVEN": "yes"}, log_name="agent/step")
        return container.labels, host_uid(container.attrs["State"]["Pid"]), result

    labels, init_uid, result = asyncio.run(session(roots, "pm-exec", scenario, backend="podman", image=image))
    uid = pwd.getpwnam(USER).pw_uid
    assert labels["tracetap.session"] == SID and labels["tracetap.task"] == "task-1"
    assert init_uid == uid  # the container's init, seen from the host
    assert result.returncode == 3
    assert result.stdout_path.read_text().split() == ["/tracetap/session/workspace", "yes", "0"]
    assert result.stderr_path.read_text() == "oops\n"
    assert (roots / SID / "workspace" / "made").stat().st_uid == uid  # root inside is the user outside
    assert containers("pm-exec") == []


def test_timeout_kills_the_command_group(image: str, roots: Path) -> None:
    result, counts = asyncio.run(session(roots, "pm-timeout", hang_past_a_timeout, backend="podman", image=image))
    assert result.timed_out
    assert counts[-1] == "0"


def test_gateway_link_reaches_only_the_gateway(image: str, roots: Path) -> None:
    async def probe(gateway_url: str, other: int):
        async def scenario(runtime, url):
            link = urlsplit(url)
            probes = [fetch(link.hostname, link.port), fetch("127.0.0.1", other), "ls /sys/class/net"]
            return await probe_outputs(runtime, probes)

        return await session(roots, "pm-net", scenario, gateway_url, backend="podman", image=image,
                             network="gateway")

    outputs = asyncio.run(beside_a_stranger(probe))
    assert outputs[0].strip() == "gateway"
    assert outputs[1].strip() == "unreachable"
    assert outputs[2].split() == ["lo"]  # no interface but loopback: nothing off the container is routable


def test_a_new_node_sweeps_what_a_killed_node_left(image: str, roots: Path) -> None:
    check_sweep_after_crash(roots / "node", image, "podman", "pm-crash", containers)


CALL = ("python3 -c 'import json, os, urllib.request as u\n"
        "body = json.dumps({\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}).encode()\n"
        "for _ in range(2):\n"
        "    r = u.Request(os.environ[\"OPENAI_BASE_URL\"] + \"/chat/completions\", body, "
        "{\"Authorization\": \"Bearer \" + os.environ[\"OPENAI_API_KEY\"], \"Content-Type\": \"application/json\"})\n"
        "    print(json.load(u.urlopen(r))[\"choices\"][0][\"finish_reason\"])'")


def test_a_shell_session_in_podman_records_its_calls(gw, image: str, roots: Path) -> None:
    task = TaskRequest.model_validate({"task_id": "podman-shell", "instruction": "x", "timeout_seconds": 120,
                                       "agent": {"harness": "shell", "settings": {"command": CALL}},
                                       "runtime": {"backend": "podman", "image": image}})
    node = GatewayNode(NodeConfig(store=gw.store, sessions_root=roots, gateway_url=gw.url, node_id="pm-shell"))
    ctx = SessionContext(session_id=new_session_id(), task=task)

    async def scenario():
        try:
            return await node.run_session(ctx)
        finally:
            await node.shutdown()

    result = asyncio.run(scenario())
    assert result.status == SessionStatus.COMPLETED, result.error
    calls = connect(gw.store).execute("SELECT count(*) FROM completions WHERE session_id = ? AND status = 'ok'",
                                      [ctx.session_id]).fetchone()[0]
    assert calls == 2 and result.traces == 2
    assert containers("pm-shell") == []


def test_image_build_loads_the_base_image_into_podman(podman_host: str, image_build) -> None:
    tag = image_tag(image_build("--harness", "pi", "--podman"))
    client = docker.DockerClient(base_url=podman_host)
    try:
        out = client.containers.run(tag, ["bash", "-lc", "pi --version && id -u"], remove=True,
                                    network_mode="none")
    finally:
        client.close()
    assert out.decode().split()[-1] == "0"  # root in the container: the unprivileged user outside


@pytest.mark.parametrize(("where", "spec", "words"), [
    ("private", {}, "must be searchable by that user"),
    ("open", {"cpus": 1.0, "memory_mb": 256}, "cannot enforce runtime.cpus or memory_mb"),
])
def test_what_rootless_cannot_do_is_a_clear_error(image: str, roots: Path, where: str, spec: dict,
                                                  words: str) -> None:
    """A sessions root the podman user cannot search; limits that cgroup v1 rootless would silently drop."""
    client = docker.DockerClient(base_url=podman_url())
    cgroup_version = client.info().get("CgroupVersion")
    client.close()
    if spec and cgroup_version != "1":
        pytest.skip("cgroup v2: rootless podman can enforce limits here")
    root = roots / where
    root.mkdir(mode=0o700 if where == "private" else 0o755)

    async def scenario(runtime):
        raise AssertionError("the runtime started")

    with pytest.raises(RuntimeUnavailable, match=words):
        asyncio.run(session(root / "sessions", f"pm-{where}", scenario, backend="podman", image=image, **spec))
    assert containers(f"pm-{where}") == []
