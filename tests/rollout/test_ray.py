"""Gateway nodes as Ray actors: a real local Ray cluster, real actors, a real scripted gateway, real kills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import live
import pytest
import ray
from conftest import DEMO, PYTHON
from tracetap.rollout.node import NodeConfig
from tracetap.rollout.ray_nodes import RayNode, ray_cluster
from tracetap.rollout.runtimes.processes import GROUPS_FILE, group_members, is_alive
from tracetap.rollout.server import BackgroundServer, create_app

from tracetap.launch import free_port

pytestmark = pytest.mark.ray

ONE_CALL = (f"{PYTHON} -c 'from openai import OpenAI\n"
            "OpenAI(max_retries=0).chat.completions.create(model=\"m\", messages=[{\"role\": \"user\", "
            "\"content\": \"hi\"}])'")
TASK_SECONDS = 300  # generous: 2 shared cores, Ray workers and a gateway on them


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster("local", cpus=4):
        yield


def start_server(gw, sessions: Path, prefix: str, **workers: int) -> tuple[BackgroundServer, list[RayNode]]:
    nodes: list[RayNode] = []

    def make() -> list[RayNode]:
        nodes.extend(RayNode(NodeConfig(store=gw.store, sessions_root=sessions, gateway_url=gw.url,
                                        node_id=f"{prefix}{i}", **workers), num_cpus=1) for i in range(2))
        return nodes
    server = BackgroundServer(create_app(gw.store, make))
    server.start(timeout=240)
    return server, nodes


def shell_task(task_id: str, command: str, samples: int) -> dict:
    return {"task_id": task_id, "instruction": "x", "num_samples": samples, "timeout_seconds": 120,
            "agent": {"harness": "shell", "settings": {"command": command}},
            "evaluator": {"name": "session_completed"}}


def poll(check, timeout: float, what: str):
    """`check()` until it returns something truthy, at most `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout} s")


def finished(client: httpx.Client, task_id: str) -> dict:
    return poll(lambda: (body := client.get(f"/tasks/{task_id}").json())["status"] != "running" and body,
                TASK_SECONDS, f"task {task_id} finished")


def test_eight_sessions_run_on_both_actors_with_rewards(cluster, gw, tmp_path):
    server, _ = start_server(gw, tmp_path / "sessions", "eight-")
    try:
        with httpx.Client(base_url=server.url, timeout=60, trust_env=False,
                          headers=live.control_headers()) as client:
            assert client.post("/tasks", json=shell_task("ray-eight", ONE_CALL, 8)).status_code == 200
            done = finished(client, "ray-eight")
    finally:
        server.stop()
    assert done["status"] == "completed"
    assert [r["status"] for r in done["results"]] == ["COMPLETED"] * 8, [r["error"] for r in done["results"]]
    assert [r["reward"] for r in done["results"]] == [1.0] * 8
    assert {r["node_id"] for r in done["results"]} == {"eight-0", "eight-1"}


def busy(client: httpx.Client) -> str | None:
    """A node that is full: one session running, one READY, one in INIT waiting for a READY slot, one queued."""
    for node in client.get("/status").json()["nodes"]:
        if (node["run_inflight"], node["ready_depth"], node["init_inflight"], node["init_queue_depth"]) == (1, 1, 1, 1):
            return node["node_id"]
    return None


def recorded_groups(sessions: Path, session_id: str) -> list[int]:
    path = sessions / session_id / GROUPS_FILE
    return [json.loads(line)["pgid"] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("how", ["ray.kill", "kill -9"])
def test_a_killed_actor_loses_its_running_sessions_and_its_queued_ones_run_elsewhere(cluster, gw, tmp_path, how):
    sessions, release = tmp_path / "sessions", tmp_path / "release"
    # a background child that outlives the shell, then a wait the test ends by creating `release`
    command = f"sleep 600 & while [ ! -e {release} ]; do sleep 0.1; done; {ONE_CALL}"
    prefix = "kill-" if how == "ray.kill" else "sigkill-"
    server, nodes = start_server(gw, sessions, prefix, init_workers=1, run_workers=1, postrun_workers=1)
    try:
        with httpx.Client(base_url=server.url, timeout=60, trust_env=False,
                          headers=live.control_headers()) as client:
            assert client.post("/tasks", json=shell_task("ray-kill", command, 8)).status_code == 200
            busy_id = poll(lambda: busy(client), TASK_SECONDS, "a busy node")
            victim = next(n for n in nodes if n.id == busy_id)
            held = ray.get(victim.actor.statuses.remote(), timeout=60)
            running = [sid for sid, status in held.items() if status == "RUNNING"]
            groups = poll(lambda: recorded_groups(sessions, running[0]), 60, "the harness group recorded")
            assert any(group_members(pgid) for pgid in groups)
            if how == "ray.kill":
                ray.kill(victim.actor)
            else:
                os.kill(ray.get(victim.actor.where.remote(), timeout=60)[1], signal.SIGKILL)
            release.touch()
            done = finished(client, "ray-kill")
    finally:
        server.stop()
    results = {r["session_id"]: r for r in done["results"]}
    assert len(results) == 8 and done["status"] == "completed"
    started = {sid for sid, status in held.items() if status != "REGISTERED"}
    queued = set(held) - started
    assert len(started) == 3 and len(queued) == 1, held
    for sid in started:
        assert results[sid]["status"] == "ERROR" and results[sid]["error"].startswith("node_lost"), results[sid]
    survivor = next(n.id for n in nodes if n is not victim)
    for sid in set(results) - started:
        assert results[sid]["status"] == "COMPLETED" and results[sid]["node_id"] == survivor, results[sid]
    # the lost node's harness processes are gone, those it started while Ray was killing it included
    assert not [pgid for sid in held for pgid in recorded_groups(sessions, sid) if group_members(pgid)]
    assert not working_in(sessions)


def working_in(folder: Path) -> list[int]:
    """Live processes whose working directory is under `folder` (a harness, recorded or not)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")).is_relative_to(folder):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours to look at
            continue
    return [pid for pid in found if is_alive(pid)]


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (by the parent links in /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rfind(")") + 2:].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}  # as /proc/net has them


def listening(pids: set[int]) -> set[str]:
    """The addresses (hex, as in /proc/net/tcp and tcp6) of the TCP sockets these processes listen on."""
    inodes = set()
    for pid in pids:
        try:
            inodes |= {link[8:-1] for fd in Path(f"/proc/{pid}/fd").iterdir()
                       if (link := os.readlink(fd)).startswith("socket:[")}
        except OSError:  # it ended while we looked
            continue
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.add(fields[1].split(":")[0])
    return found


def test_cli_serve_on_a_local_ray_cluster_runs_a_task_and_stops_ray_on_sigterm(gw, tmp_path):
    port = free_port()
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - the child writes it; read back as a file
    server = subprocess.Popen([sys.executable, "-m", "tracetap.cli", "rollout", "serve", "--ray", "local",
                               "--nodes", "2", "--store", str(tmp_path / "store"), "--script",
                               str(DEMO / "script.jsonl"), "--listen", f"127.0.0.1:{port}"],
                              stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, trust_env=False,
                          headers=live.control_headers()) as client:
            poll(lambda: _nodes_up(client, server), TASK_SECONDS, "the server with its 2 nodes")
            assert client.post("/tasks", json=shell_task("cli-ray", ONE_CALL, 4)).status_code == 200
            done = finished(client, "cli-ray")
        started = descendants(server.pid)
        addresses = listening(started)
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=180) == 0, (tmp_path / "serve.log").read_text()
    finally:
        server.kill()
        server.wait()
    assert [r["status"] for r in done["results"]] == ["COMPLETED"] * 4, done
    assert {r["node_id"] for r in done["results"]} == {"node-0", "node-1"}
    assert len(started) > 3  # the gateway, Ray's own processes, the actors' workers
    assert addresses and addresses <= LOOPBACK, addresses  # Ray's servers included
    poll(lambda: not [pid for pid in started if is_alive(pid)], 60, "every process of the server ended")


def _nodes_up(client: httpx.Client, server: subprocess.Popen) -> bool:
    assert server.poll() is None, "the server exited"
    try:
        return len(client.get("/status").json()["nodes"]) == 2
    except httpx.TransportError:
        return False
