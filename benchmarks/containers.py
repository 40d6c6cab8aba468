"""Container runtimes next to the local one, measured in the same run: start-to-ready, exec cost, sessions/min.

    DOCKER_HOST=unix:///run/tracetap-docker/docker.sock python benchmarks/containers.py [--podman]

For each runtime (local, docker, and rootless podman with --podman), on the `gateway` network, with the
debootstrap rootfs image (`tracetap image build`'s first layer):
- start-to-ready ms: `runtime.start()` of a fresh session (folders; for containers create + start + the
  network link, confinement included), median over `--starts` sessions;
- exec ms: one `runtime.exec("true")` (a login shell in the runtime), median over `--execs` commands;
- sessions/min: benchmarks/rollout.py's two workloads (no-op, prepare=run) through the rollout server with
  `--sessions` shell sessions and `--workers` run workers.
Each figure also as a ratio to the local runtime's. Prints a Markdown table and a JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import docker
from tracetap.rollout.images.base import images_dir
from tracetap.rollout.images.daemon import copy_image
from tracetap.rollout.images.rootfs import ensure_rootfs
from tracetap.rollout.models import RuntimeSpec
from tracetap.rollout.runtimes import NodeRuntimes
from tracetap.rollout.runtimes.podman import podman_url

from rollout import WORKLOADS, measure
from tracetap.launch import start_gateway

SCRIPT = Path(__file__).resolve().parents[1] / "tracetap" / "demo_data" / "script.jsonl"


def prepare_image(podman: bool) -> str:
    """The rootfs image in dockerd (and in podman's store, with --podman)."""
    source = docker.from_env(timeout=1800)
    tag = ensure_rootfs(source, images_dir(), lambda line: print(line, file=sys.stderr))
    if podman:
        target = docker.DockerClient(base_url=podman_url(), timeout=1800)
        copy_image(source, target, tag, lambda line: print(line, file=sys.stderr))
        target.close()
    source.close()
    return tag


def spec(backend: str, image: str) -> RuntimeSpec:
    return RuntimeSpec() if backend == "local" else RuntimeSpec(backend=backend, image=image)


async def runtime_costs(backend: str, image: str, gateway_url: str, work: Path, starts: int, execs: int) -> dict:
    """Median start-to-ready and exec ms of one backend (every session torn down before the next)."""
    node = NodeRuntimes(f"bench-costs-{backend}", work / f"costs-{backend}")
    await node.start(gateway_url)
    start_ms, exec_ms = [], []
    try:
        for n in range(starts):
            runtime, _ = await node.create(spec(backend, image), f"sk-tap-bench-{backend}-{n}", "bench")
            began = time.perf_counter()
            await runtime.start()
            start_ms.append((time.perf_counter() - began) * 1000)
            for i in range(execs if n == 0 else 0):
                began = time.perf_counter()
                await runtime.exec("true", env={}, log_name=f"e{i}")
                exec_ms.append((time.perf_counter() - began) * 1000)
            await runtime.teardown()
    finally:
        await node.close()
    return {"runtime": backend, "start_ms": round(statistics.median(start_ms), 1),
            "exec_ms": round(statistics.median(exec_ms), 1)}


def ratio(value: float, base: float) -> str:
    return f"{value / base:.1f}x" if base else "-"


def print_table(costs: list[dict], sessions: list[dict]) -> None:
    local = costs[0]
    print("| runtime | start-to-ready ms | vs local | exec ms | vs local |")
    print("|---|---|---|---|---|")
    for row in costs:
        print(f"| {row['runtime']} | {row['start_ms']} | {ratio(row['start_ms'], local['start_ms'])} | "
              f"{row['exec_ms']} | {ratio(row['exec_ms'], local['exec_ms'])} |")
    print("\n| runtime | workload | run workers | sessions | sessions/min | vs local |")
    print("|---|---|---|---|---|---|")
    base = {r["workload"]: r["sessions_per_min"] for r in sessions if r["runtime"] == "local"}
    for r in sessions:
        print(f"| {r['runtime']} | {r['workload']} | {r['run_workers']} | {r['sessions']} | {r['sessions_per_min']} "
              f"| {ratio(r['sessions_per_min'], base[r['workload']])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--podman", action="store_true", help="also rootless podman (scripts/podman.sh start)")
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--execs", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--step", type=float, default=1.0, help="seconds of the prepare step and of the harness")
    args = parser.parse_args()
    backends = ["local", "docker", *(["podman"] if args.podman else [])]
    image = prepare_image(args.podman)
    work = Path(tempfile.mkdtemp(prefix="tracetap-containers-bench-"))
    work.chmod(0o755)  # rootless podman's user mounts the session folders from here
    costs, sessions = [], []
    with start_gateway(work / "store", "--script", str(SCRIPT)) as gateway:
        for backend in backends:
            costs.append(asyncio.run(runtime_costs(backend, image, gateway.url, work, args.starts, args.execs)))
            print(costs[-1], file=sys.stderr)
            for workload in WORKLOADS:
                runtime = None if backend == "local" else {"backend": backend, "image": image}
                sessions.append(measure(gateway.url, work / "store", work, workload, args.workers, args.sessions,
                                        args.step, runtime))
                print(sessions[-1], file=sys.stderr)
    print_table(costs, sessions)
    print(json.dumps({"costs": costs, "sessions": sessions}))


if __name__ == "__main__":
    main()
