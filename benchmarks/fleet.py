"""Fleet benchmark: what a weight-update fence costs, and how well sessions keep their engine under churn.

    python benchmarks/fleet.py --seconds 20

1. Fencing: 32 sessions call a gateway in a loop (each call takes `--delay` s upstream, like a short
   generation); every `--period` s the trainer pauses (calls in flight finish), "updates the weights" for
   `--update` s and resumes under the next version. Per cycle: calls held at the resume, seconds from the
   pause to the resume, and the run's calls/s against the same sessions with no pauses (measured first).
2. Affinity: the same load on 2 and then 4 engines behind one gateway, one engine killed and restarted on
   its port every `--churn` s. Reports the share of calls that reached the engine their session started on
   (from the store's `engine` column) and the failed calls.

Prints a Markdown table per part and a JSON line with the raw numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx
from gateway_overhead import agent_request, fast_upstream, start_upstream
from tracetap.capture.http1 import Pool
from tracetap.capture.jsontext import dump_bytes
from tracetap.capture.upstream import SESSION_HEADER
from tracetap.store import connect

from tracetap.control import control_token
from tracetap.launch import free_port, start_gateway

SESSIONS = 32


async def _loop(client: Pool, session: str, until: float, body: bytes, outcomes: list[int]) -> None:
    headers = {"content-type": "application/json", SESSION_HEADER: session}
    while time.monotonic() < until:
        reply = await client.request("POST", "/v1/chat/completions", body, headers, timeout=120)
        outcomes.append(reply.status)


async def load(base: str, seconds: float, tag: str, during=None) -> list[int]:
    """HTTP statuses of every call 32 looping sessions made in `seconds` (`during`: a coroutine alongside)."""
    client, outcomes = Pool(base), list[int]()
    until = time.monotonic() + seconds
    body = dump_bytes(agent_request(4))
    try:
        loops = [_loop(client, f"{tag}-{i}", until, body, outcomes) for i in range(SESSIONS)]
        await asyncio.gather(*loops, *([during(until)] if during else []))
    finally:
        await client.aclose()
    return outcomes


def fence_cycles(base: str, period: float, update: float, cycles: list[dict]):
    async def run(until: float) -> None:
        token = {"authorization": f"Bearer {control_token()}"}  # the fence needs the control token
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=token) as admin:
            version = 1
            while time.monotonic() + period < until:
                await asyncio.sleep(period)
                paused = time.monotonic()
                await admin.post("/admin/pause", json={"in_flight": "finish"})
                while (await admin.get("/admin/status")).json()["in_flight"]:
                    await asyncio.sleep(0.01)
                drained = time.monotonic()
                await asyncio.sleep(update)  # the trainer pushes new weights here
                held = (await admin.get("/admin/status")).json()["waiting"]
                version += 1
                await admin.post("/admin/resume", json={"policy_version": version})
                cycles.append({"held": held, "drain_s": drained - paused, "lost_s": time.monotonic() - paused})
    return run


def fencing(args: argparse.Namespace, root: Path) -> dict:
    with fast_upstream(args.delay) as upstream, start_gateway(root / "fence", "--upstream", upstream,
                                                              "--policy-version", "1") as gw:
        baseline = asyncio.run(load(gw.url, args.seconds, "free"))
        cycles: list[dict] = []
        fenced = asyncio.run(load(gw.url, args.seconds, "fenced", fence_cycles(gw.url, args.period, args.update,
                                                                                cycles)))
    return {"baseline_rate": len(baseline) / args.seconds, "fenced_rate": len(fenced) / args.seconds,
            "failed": sum(status != 200 for status in fenced), "cycles": cycles}


def churn(ports: list[int], every: float, delay: float, processes: dict):
    async def run(until: float) -> None:
        turn = 0
        while time.monotonic() + every < until:
            await asyncio.sleep(every)
            port = ports[turn % len(ports)]
            processes[port].kill()
            processes[port].join()
            await asyncio.sleep(1.0)  # down for a second, then back on its port
            processes[port] = await asyncio.to_thread(start_upstream, port, delay)
            turn += 1
    return run


def affinity(args: argparse.Namespace, root: Path, engines: int) -> dict:
    ports = [free_port() for _ in range(engines)]
    processes = {port: start_upstream(port, args.delay) for port in ports}
    upstreams = [arg for port in ports for arg in ("--upstream", f"http://127.0.0.1:{port}")]
    try:
        with start_gateway(root / f"affinity-{engines}", *upstreams) as gw:
            outcomes = asyncio.run(load(gw.url, args.seconds, f"aff{engines}",
                                        churn(ports, args.churn, args.delay, processes)))
            gw.stop()
            with connect(gw.store) as con:
                rows = con.execute("SELECT session_id, seq, engine FROM completions WHERE status = 'ok' "
                                   "ORDER BY session_id, seq").fetchall()
    finally:
        for process in processes.values():
            process.kill()
    return {"engines": engines, "calls": len(outcomes), "failed": sum(s != 200 for s in outcomes),
            "affinity": _kept(rows)}


def _kept(rows: list[tuple]) -> float:
    """Share of calls served by the engine their session's first call went to."""
    first: dict[str, str] = {}
    kept: defaultdict[bool, int] = defaultdict(int)
    for session, _, engine in rows:
        first.setdefault(session, engine)
        kept[engine == first[session]] += 1
    return kept[True] / max(1, len(rows))


def report(fence: dict, pools: list[dict]) -> None:
    cycles = fence["cycles"]
    held, lost, drain = (statistics.median(c[key] for c in cycles) for key in ("held", "lost_s", "drain_s"))
    print("| cycles | calls held per resume (median) | s from pause to resume (median) | drain s (median) "
          "| calls/s fenced / unfenced | failed calls |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {len(cycles)} | {held:.0f} | {lost:.2f} | {drain:.2f} "
          f"| {fence['fenced_rate']:.0f} / {fence['baseline_rate']:.0f} "
          f"({fence['fenced_rate'] / fence['baseline_rate']:.2f}x) | {fence['failed']} |")
    print("\n| engines | calls | on their session's first engine | failed calls |")
    print("|---:|---:|---:|---:|")
    for pool in pools:
        print(f"| {pool['engines']} | {pool['calls']} | {pool['affinity']:.1%} | {pool['failed']} |")
    print(json.dumps({"fence": fence, "pools": pools}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each measured run")
    parser.add_argument("--delay", type=float, default=0.2, help="upstream seconds per call")
    parser.add_argument("--period", type=float, default=4.0, help="seconds between weight updates")
    parser.add_argument("--update", type=float, default=0.5, help="seconds a weight update takes")
    parser.add_argument("--churn", type=float, default=5.0, help="seconds between engine kills")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracetap-fleet-") as tmp:
        root = Path(tmp)
        report(fencing(args, root), [affinity(args, root, engines) for engines in (2, 4)])


if __name__ == "__main__":
    main()
