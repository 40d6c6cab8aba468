"""Gateway overhead: the same calls to a fast upstream directly and through the gateway.

The upstream is a minimal asyncio HTTP server answering every chat call with a real vLLM response
(shared fixture chat_basic.json, token ids and logprobs included), so the difference is the gateway:
mitmproxy, normalization, token capture, the durable Parquet write, the response translation.

    python benchmarks/gateway_overhead.py --calls 1000

Prints a table of median / p99 latency per call and calls/s, sequential and with 32 concurrent sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
from tracetap.store import connect

from tracetap.launch import free_port, start_gateway

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm-0.32.0" / "chat_basic.json"
REQUEST = {"model": "bench", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}


def upstream_body() -> bytes:
    return FIXTURE.read_bytes()


async def _serve_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> None:
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n")
    try:
        while True:
            headers = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in headers.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if length:
                await reader.readexactly(length)
            writer.write(head + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def start_fast_upstream(port: int) -> None:
    body = upstream_body()

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: _serve_client(r, w, body), "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    threading.Thread(target=asyncio.run, args=(main(),), daemon=True).start()


async def _session(client: httpx.AsyncClient, url: str, session: str, calls: int, out: list[float]) -> None:
    headers = {"x-tracetap-session": session}
    for _ in range(calls):
        start = time.perf_counter()
        reply = await client.post(url, json=REQUEST, headers=headers)
        reply.raise_for_status()
        out.append((time.perf_counter() - start) * 1000)


async def measure(base: str, calls: int, sessions: int) -> dict:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        await _session(client, f"{base}/v1/chat/completions", "warmup", 20, [])
        start = time.perf_counter()
        await asyncio.gather(*[
            _session(client, f"{base}/v1/chat/completions", f"bench-{sessions}-{i}", calls // sessions, latencies)
            for i in range(sessions)
        ])
        elapsed = time.perf_counter() - start
    latencies.sort()
    return {"median": statistics.median(latencies), "p99": latencies[int(len(latencies) * 0.99) - 1],
            "rate": len(latencies) / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    port = free_port()
    start_fast_upstream(port)
    direct = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp, \
            start_gateway(Path(tmp) / "store", "--upstream", direct, "--served-model", "tiny") as gateway:
        rows = []
        for sessions in (1, 32):
            base = asyncio.run(measure(direct, args.calls, sessions))
            through = asyncio.run(measure(gateway.url, args.calls, sessions))
            rows.append((sessions, base, through))
        recorded = connect(Path(tmp) / "store").execute("SELECT count(*) FROM completions").fetchone()[0]
    print(json.dumps({"calls": args.calls, "rows_recorded": recorded}))
    print("| sessions | direct median ms | gateway median ms | added median ms | added p99 ms | gateway calls/s |")
    print("|---|---|---|---|---|---|")
    for sessions, base, through in rows:
        added, added_p99 = through["median"] - base["median"], through["p99"] - base["p99"]
        print(f"| {sessions} | {base['median']:.2f} | {through['median']:.2f} | "
              f"{added:.2f} | {added_p99:.2f} | {through['rate']:.0f} |")


if __name__ == "__main__":
    main()
