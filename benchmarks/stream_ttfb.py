"""Time to first byte of a streamed chat call: directly from the embedded engine vs through the gateway.

The engine (a `tracetap engine` process with a fixed scripted reply, no pacing) answers the same streamed
request in both cases; through the gateway (`tracetap gateway --upstream URL`) the call is also
normalized, sent upstream as a stream with token flags, and its first chunk translated before it is sent
on. The first byte is the first byte of the response body (the first SSE event). Calls alternate between
the two targets so a busy machine slows both alike; each figure is a median over `--calls` calls.

    python benchmarks/stream_ttfb.py --calls 30

Goal: the gateway's median time to first byte within 5 ms of the engine's.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tracetap.launch import ChildProcess, free_port, start_gateway

REQUEST = {"model": "bench", "messages": [{"role": "user", "content": "Say hi."}], "stream": True}
REPLY = '{"content": "Hello there, this is a streamed reply of a few tokens."}\n'
READY = re.compile("tracetap engine serving")


@dataclass
class EngineChild(ChildProcess):
    process: subprocess.Popen
    log_path: Path


def start_engine(workdir: Path) -> tuple[ChildProcess, str]:
    """`tracetap engine` with a one-line script on a free port; (process, base URL)."""
    script = workdir / "script.jsonl"
    script.write_text(REPLY)
    port = free_port()
    log_path = workdir / "engine.log"
    with open(log_path, "wb") as log:
        cmd = [sys.executable, "-m", "tracetap.cli", "engine", "--listen", f"127.0.0.1:{port}",
               "--script", str(script)]
        process = EngineChild(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log_path)
    process.wait_for(READY, 180.0, "engine")
    return process, f"http://127.0.0.1:{port}"


def first_byte_ms(client: httpx.Client, url: str) -> float:
    """Milliseconds from sending the request to the first body byte; the rest of the stream is read too."""
    started = time.perf_counter()
    with client.stream("POST", url, json=REQUEST) as response:
        chunks = response.iter_raw()
        next(chunks)
        first = (time.perf_counter() - started) * 1000
        for _ in chunks:
            pass
    return first


def measure(calls: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        engine, engine_url = start_engine(Path(tmp))
        try:
            with start_gateway(Path(tmp) / "store", "--upstream", engine_url) as gateway, httpx.Client() as client:
                urls = {"engine": f"{engine_url}/v1/chat/completions",
                        "gateway": f"{gateway.url}/s/bench/v1/chat/completions"}
                for url in urls.values():  # warm up: connections, the engine's caches
                    first_byte_ms(client, url)
                times: dict[str, list[float]] = {name: [] for name in urls}
                for _ in range(calls):
                    for name, url in urls.items():
                        times[name].append(first_byte_ms(client, url))
                return times
        finally:
            engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30, help="streamed calls per target")
    args = parser.parse_args()
    times = measure(args.calls)
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(f"{name:8s} time to first byte: median {medians[name]:6.2f} ms  "
              f"(min {min(values):.2f}, max {max(values):.2f}, {len(values)} calls)")
    added = medians["gateway"] - medians["engine"]
    print(f"added by the gateway: {added:.2f} ms (goal: within 5 ms) -> {'met' if added <= 5 else 'missed'}")


if __name__ == "__main__":
    main()
