"""Rollout benchmark: sessions per minute, RUN-slot utilisation and the machinery's own cost per session.

    python benchmarks/rollout.py --sessions 8 --step 1.0

For run workers 1, 2 and 4 (INIT workers = run workers, one node, the real HTTP server, a scripted
gateway), two workloads of `--sessions` shell-harness sessions each: `no-op` (the harness is `true`,
nothing to prepare) and `prepare=run` (a prepare step of `sleep STEP` and a harness of `sleep STEP`).
A task is submitted over HTTP and its callback received by a local receiver.
- sessions/min: sessions over the wall time from submit to callback;
- RUN utilisation: time RUN slots were busy (the sessions' run spans, from their recorded timelines)
  over run workers x (last run end - first run start), i.e. after warm-up;
- machinery ms/session (no-op, run workers 1, so sessions run one after another): submit to callback,
  minus the harness (run spans, which include spawning it), over the sessions. No-op sessions make no
  model call, so there is no build time to subtract.
Prints a Markdown table and a JSON line with the raw numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx
from tracetap.rollout.callbacks import LocalReceiver
from tracetap.rollout.node import GatewayNode, NodeConfig
from tracetap.rollout.server import BackgroundServer, create_app

from tracetap.control import control_token
from tracetap.launch import start_gateway

WORKLOADS = ("no-op", "prepare=run")


def task_body(task_id: str, workload: str, sessions: int, step: float, callback: str,
              runtime: dict | None = None) -> dict:
    """`runtime`: more RuntimeSpec fields (a container backend and its image); default the local runtime."""
    prepare = [{"type": "exec", "command": f"sleep {step}"}] if workload == "prepare=run" else []
    command = f"sleep {step}" if workload == "prepare=run" else "true"
    return {"task_id": task_id, "instruction": "benchmark", "num_samples": sessions, "timeout_seconds": 600,
            "runtime": {"prepare": prepare, **(runtime or {})},
            "agent": {"harness": "shell", "settings": {"command": command}}, "callback_url": callback}


def utilisation(results: list[dict], run_workers: int) -> float:
    spans = [(r["timeline"]["run_start"], r["timeline"]["run_end"]) for r in results]
    window = max(end for _, end in spans) - min(start for start, _ in spans)
    return sum(end - start for start, end in spans) / (run_workers * window) if window > 0 else 0.0


def measure(gateway_url: str, store: Path, work: Path, workload: str, run_workers: int, sessions: int,
            step: float, runtime: dict | None = None) -> dict:
    backend = (runtime or {}).get("backend", "local")
    nodes = lambda: [GatewayNode(NodeConfig(store=store, sessions_root=work / "sessions", gateway_url=gateway_url,  # noqa: E731
                                            init_workers=run_workers, run_workers=run_workers,
                                            node_id=f"bench-{backend}"))]
    task_id = f"bench-{backend}-{workload.replace('=', '-')}-{run_workers}"
    with BackgroundServer(create_app(store, nodes)) as server, LocalReceiver() as receiver, \
            httpx.Client(base_url=server.url, trust_env=False, timeout=30,
                         headers={"authorization": f"Bearer {control_token()}"}) as client:
        started = time.time()
        body = task_body(task_id, workload, sessions, step, receiver.url, runtime)
        client.post("/tasks", json=body).raise_for_status()
        receiver.arrived.wait(600)
        wall = time.time() - started
    results = receiver.bodies[0]["results"]
    assert all(r["status"] == "COMPLETED" for r in results), [r["error"] for r in results]
    serial_noop = run_workers == 1 and workload == "no-op"
    harness_s = sum(r["timeline"]["run_end"] - r["timeline"]["run_start"] for r in results)
    return {"runtime": backend, "workload": workload, "run_workers": run_workers, "sessions": sessions,
            "wall_s": round(wall, 3),
            "sessions_per_min": round(sessions / wall * 60, 1),
            "run_utilisation": round(utilisation(results, run_workers), 3),
            "machinery_ms_per_session": round((wall - harness_s) / sessions * 1000, 1) if serial_noop else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--step", type=float, default=1.0, help="seconds of the prepare step and of the harness")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tracetap-rollout-bench-"))
    script = Path(__file__).resolve().parents[1] / "tracetap" / "demo_data" / "script.jsonl"
    rows = []
    with start_gateway(work / "store", "--script", str(script)) as gateway:
        for workload in WORKLOADS:
            for workers in args.workers:
                rows.append(measure(gateway.url, work / "store", work, workload, workers, args.sessions, args.step))
                print(rows[-1], file=sys.stderr)
    print("| workload | run workers | sessions | wall s | sessions/min | RUN utilisation | machinery ms/session |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cost = "" if r["machinery_ms_per_session"] is None else r["machinery_ms_per_session"]
        print(f"| {r['workload']} | {r['run_workers']} | {r['sessions']} | {r['wall_s']} | {r['sessions_per_min']} "
              f"| {r['run_utilisation']:.0%} | {cost} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
