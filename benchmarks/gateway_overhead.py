"""Gateway overhead: the same calls directly, through a bare mitmdump, and through the gateway, in one run.

The upstream is a minimal asyncio HTTP server in its own process answering every chat call with a real
vLLM response (shared fixture chat_basic.json, token ids and logprobs included), so the difference is the
proxy: for bare `mitmdump --mode reverse:` only mitmproxy's forwarding, for the gateway also
normalization, token capture, the durable record and the response translation (capture on, durable).
The client is the gateway's own keep-alive pool (capture/http1.py): httpx's pool caps near 300 calls/s
here with 32 sessions, which would hide the proxies' difference. Rounds alternate the three targets so a
busy machine slows all of them alike; each figure is the median over rounds.

    python benchmarks/gateway_overhead.py --calls 1000 --rounds 3

Prints, sequentially and with 32 concurrent sessions: median / p99 latency, latency added over the direct
call, calls/s, the proxy process's CPU time per call (all its threads; steadier than latency on a busy
machine), and the gateway's ratios to bare mitmdump (the goals: added median <= 1.5x, with 32 sessions
>= 2/3 of its calls/s and p99 <= 2x).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path

from deltalake import DeltaTable
from tracetap.capture.http1 import Pool
from tracetap.capture.jsontext import dump_bytes
from tracetap.capture.upstream import SESSION_HEADER
from tracetap.store import connect

from tracetap.launch import ChildProcess, free_port, start_gateway

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm-0.32.0"
FIXTURE = FIXTURES / "chat_basic.json"
MODELS = FIXTURES / "models.json"  # vLLM's /v1/models, which the gateway reads to resolve model names
REQUEST = {"model": "bench", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
TOOLS = 16  # an agent request's tool definitions, each with a nested parameter schema
MITMDUMP = Path(sys.executable).parent / "mitmdump"
TARGETS = ("direct", "mitmdump", "gateway")
CONCURRENCY = (1, 32)


def upstream_body() -> bytes:
    return FIXTURE.read_bytes()


def _answer(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


async def _serve_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes,
                        delay: float = 0.0) -> None:
    """Every call answered with `body`, except GET /v1/models, answered with vLLM's model list."""
    answer, models = _answer(body), _answer(MODELS.read_bytes())
    try:
        while True:
            headers = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in headers.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if length:
                await reader.readexactly(length)
            if delay:
                await asyncio.sleep(delay)  # an engine that takes its time (benchmarks/fleet.py)
            writer.write(models if headers.startswith(b"GET /v1/models") else answer)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def serve_upstream(port: int, delay: float = 0.0) -> None:
    """The fast upstream, forever (run in its own process so it never competes with the client's GIL);
    `delay` seconds before each answer."""
    body = upstream_body()

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: _serve_client(r, w, body, delay), "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def start_upstream(port: int, delay: float = 0.0) -> BaseProcess:
    """The upstream's process on `port`, listening when this returns."""
    process = multiprocessing.get_context("spawn").Process(target=serve_upstream, args=(port, delay), daemon=True)
    process.start()
    try:
        _wait_listening(port)
    except BaseException:
        process.terminate()
        raise
    return process


@contextmanager
def fast_upstream(delay: float = 0.0):
    """The upstream's base URL while its process runs."""
    port = free_port()
    process = start_upstream(port, delay)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.join()


@dataclass
class MitmdumpProcess(ChildProcess):
    """A bare `mitmdump --mode reverse:UPSTREAM`: mitmproxy's own forwarding and nothing else."""

    port: int
    process: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_mitmdump(upstream: str, workdir: Path) -> MitmdumpProcess:
    port = free_port()
    log_path = workdir / f"mitmdump-{port}.log"
    cmd = [str(MITMDUMP), "--mode", f"reverse:{upstream}", "--listen-host", "127.0.0.1",
           "--listen-port", str(port), "--set", f"confdir={workdir / 'mitmproxy'}", "-q"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    proxy = MitmdumpProcess(port, process, log_path)
    try:
        _wait_listening(port, process)
    except RuntimeError:
        proxy.stop()
        raise RuntimeError(f"mitmdump did not start:\n{proxy.log()[-3000:]}") from None
    return proxy


def _wait_listening(port: int, process: subprocess.Popen | None = None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (process is None or process.poll() is None):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def agent_request(kb: int) -> dict:
    """A request shaped like an agent harness's: a system prompt of about `kb` KB, tools with nested
    schemas, a short history. `kb` 0 is the one-line request."""
    if kb <= 0:
        return REQUEST
    system = " ".join(f"Rule {i}: keep edits small and run the tests." for i in range(kb * 22))
    schema = {"type": "object", "properties": {"path": {"type": "string", "description": "A file path."},
                                               "lines": {"type": "array", "items": {"type": "integer"}}},
              "required": ["path"]}
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "Reads a file.",
                                               "parameters": schema}} for i in range(TOOLS)]
    history = [{"role": "user", "content": "Fix the failing test."},
               {"role": "assistant", "content": "Reading the test first."}, {"role": "user", "content": "Go on."}]
    return {**REQUEST, "messages": [{"role": "system", "content": system}, *history], "tools": tools}


async def _session(client: Pool, session: str, calls: int, out: list[float], body: bytes) -> None:
    headers = {"content-type": "application/json", SESSION_HEADER: session}
    for _ in range(calls):
        start = time.perf_counter()
        reply = await client.request("POST", "/v1/chat/completions", body, headers, timeout=60)
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {reply.content[:300]!r}")
        out.append((time.perf_counter() - start) * 1000)


async def measure(base: str, calls: int, sessions: int, tag: str, pid: int | None,
                  body: bytes) -> dict[str, float]:
    """p50 / p99 latency (ms), calls/s and the proxy's CPU ms per call (0 without a proxy) of `calls`
    calls spread over `sessions` concurrent sessions."""
    latencies: list[float] = []
    client = Pool(base)
    try:
        await asyncio.gather(*[_session(client, f"warmup-{tag}-{i}", 5, [], body) for i in range(sessions)])
        start, cpu = time.perf_counter(), cpu_seconds(pid)
        await asyncio.gather(*[_session(client, f"bench-{tag}-{i}", calls // sessions, latencies, body)
                               for i in range(sessions)])
        elapsed, cpu = time.perf_counter() - start, cpu_seconds(pid) - cpu
    finally:
        await client.aclose()
    latencies.sort()
    return {"p50": statistics.median(latencies), "p99": latencies[int(len(latencies) * 0.99) - 1],
            "rate": len(latencies) / elapsed, "cpu": cpu * 1000 / len(latencies)}


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process and its live child processes (the gateway's table committer), all
    their threads included (Linux /proc); 0 for None."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(cpu_seconds(child) for child in children(pid))


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (started by any of its threads)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def fdatasync_ms(directory: Path, times: int = 200) -> float:
    """Median time of one 2 KB append + fdatasync in `directory`: the durability floor a lone call waits for."""
    path = directory / "fdatasync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        spent = []
        for _ in range(times):
            start = time.perf_counter()
            os.write(fd, b"x" * 2048)
            os.fdatasync(fd)
            spent.append((time.perf_counter() - start) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(spent)


def run_rounds(targets: dict[str, tuple[str, int | None]], calls: int, rounds: int,
               body: bytes) -> dict[tuple[str, int], dict[str, float]]:
    """Per (target, sessions): each metric's median over the rounds. `targets`: name -> (URL, proxy pid)."""
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    for number in range(rounds):
        for sessions in CONCURRENCY:
            for target in TARGETS:
                url, pid = targets[target]
                result = asyncio.run(measure(url, calls, sessions, f"{number}-{sessions}", pid, body))
                runs.setdefault((target, sessions), []).append(result)
    return {key: {m: statistics.median(r[m] for r in results) for m in results[0]}
            for key, results in runs.items()}


def print_report(stats: dict[tuple[str, int], dict[str, float]], calls: int, rounds: int) -> None:
    print(f"calls per measurement: {calls}, rounds: {rounds} (medians over rounds)")
    print("| sessions | target | median ms | p99 ms | added median ms | added p99 ms | calls/s | proxy CPU ms/call |")
    print("|---|---|---|---|---|---|---|---|")
    for sessions in CONCURRENCY:
        direct = stats[("direct", sessions)]
        for target in TARGETS:
            s = stats[(target, sessions)]
            print(f"| {sessions} | {target} | {s['p50']:.2f} | {s['p99']:.2f} | {s['p50'] - direct['p50']:.2f} | "
                  f"{s['p99'] - direct['p99']:.2f} | {s['rate']:.0f} | {s['cpu']:.2f} |")
    print(ratios(stats))


class LogSize:
    """The largest size the store's group-commit log reached, sampled every 0.2 s on a thread: bounded when
    the compactor commits as fast as the gateway records."""

    def __init__(self, root: Path) -> None:
        self.root, self.largest = root, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            sizes = []
            for path in (self.root / "log").glob("*.jsonl"):
                with contextlib.suppress(FileNotFoundError):
                    sizes.append(path.stat().st_size)
            self.largest = max(self.largest, sum(sizes))

    def __enter__(self) -> LogSize:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def ratios(stats: dict[tuple[str, int], dict[str, float]]) -> str:
    """The gateway against bare mitmdump, with the goals."""
    def added(target: str) -> float:
        return stats[(target, 1)]["p50"] - stats[("direct", 1)]["p50"]

    gateway, bare = stats[("gateway", 32)], stats[("mitmdump", 32)]
    cpu = stats[("gateway", 1)]["cpu"] / stats[("mitmdump", 1)]["cpu"]
    return (f"gateway / bare mitmdump: added median {added('gateway') / added('mitmdump'):.2f}x (goal <= 1.5); "
            f"32 sessions calls/s {gateway['rate'] / bare['rate']:.2f}x (goal >= 0.67), "
            f"p99 {gateway['p99'] / bare['p99']:.2f}x (goal <= 2); CPU per call {cpu:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle-compact", type=float, default=0.0,
                        help="the gateway's --idle-compact: at 0 its compactor commits every session's new calls "
                             "every 0.5 s while the rounds run")
    parser.add_argument("--request-kb", type=int, default=0,
                        help="send an agent-shaped request with a system prompt of about this many KB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, fast_upstream() as direct, \
            start_mitmdump(direct, Path(tmp)) as bare, \
            start_gateway(Path(tmp) / "store", "--upstream", direct, "--served-model", "tiny",
                          "--idle-compact", str(args.idle_compact)) as gateway, LogSize(Path(tmp) / "store") as log:
        targets = {"direct": (direct, None), "mitmdump": (bare.url, bare.process.pid),
                   "gateway": (gateway.url, gateway.process.pid)}
        body = dump_bytes(agent_request(args.request_kb))
        stats = run_rounds(targets, args.calls, args.rounds, body)
        sync_ms = fdatasync_ms(Path(tmp))
        [(recorded,)] = connect(Path(tmp) / "store").execute("SELECT count(*) FROM completions").fetchall()
        table = str(Path(tmp) / "store" / "completions")
        committed = DeltaTable(table).count() if DeltaTable.is_deltatable(table) else 0
    print(f"calls recorded by the gateway: {recorded}, committed to the completions table by its compactor "
          f"meanwhile: {committed}; the log held at most {log.largest / 1e6:.2f} MB")
    print(f"request body: {len(body)} bytes")
    print(f"one 2 KB append + fdatasync in the store's directory: {sync_ms:.2f} ms (median)")
    print_report(stats, args.calls, args.rounds)


if __name__ == "__main__":
    main()
