"""A flood of invalid calls (marker `soak`, run by scripts/test.sh): 20,000 requests, each naming a fresh
session and each refused before it is bound (a body that is no JSON, an unknown path, a malformed request),
make no session and write nothing; afterwards the idle gateway costs next to no CPU and answers cheap calls
about as fast as before the flood."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import httpx
import live
import pytest
from tracetap.store import StoreReader

pytestmark = pytest.mark.soak

FLOOD, THREADS, PROBES = 20_000, 4, 300
CHAT = "/v1/chat/completions"
GOOD = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def invalid(client: httpx.Client, n: int) -> int:
    """One of three refusals, each under a session id never seen before."""
    sid = f"flood-{n}"
    if n % 3 == 0:
        return client.post(f"/s/{sid}{CHAT}", content=b"{not json", headers={"content-type": "application/json"}
                           ).status_code
    if n % 3 == 1:
        return client.post(f"/s/{sid}/v1/no-such-endpoint", json=GOOD).status_code
    return client.post(CHAT, json={"model": "m", "messages": "not a list"}, headers={"x-tracetap-session": sid}
                       ).status_code


def flood(url: str) -> set[int]:
    statuses: set[int] = set()

    def worker(start: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            statuses.update(invalid(client, n) for n in range(start, FLOOD, THREADS))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


def cheap_rate(url: str, rounds: int = 3) -> float:
    """Model lists per second on one connection (answered by the gateway alone), the best of a few rounds:
    a busy machine only ever slows a round down."""
    with httpx.Client(base_url=url, timeout=30) as client:
        client.get("/v1/models").raise_for_status()
        return max(_rate(client) for _ in range(rounds))


def _rate(client: httpx.Client) -> float:
    started = time.perf_counter()
    for _ in range(PROBES):
        client.get("/v1/models").raise_for_status()
    return PROBES / (time.perf_counter() - started)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sessions_in(store: Path) -> set[str]:
    """The sessions the store shows: with a completion (committed or logged), or with a row (committed or live)."""
    reader = StoreReader(store)
    return set(reader.session_ids()) | {row["session_id"] for row in reader.sessions()}


def test_a_flood_of_invalid_calls_makes_no_session_and_leaves_the_gateway_as_it_was(tmp_path):
    with live.StubUpstream() as stub, live.start_gateway(tmp_path / "store", "--upstream", stub.url) as gw:
        httpx.post(f"{gw.url}{CHAT}", json=GOOD, headers={"x-tracetap-session": "before"}).raise_for_status()
        fresh = cheap_rate(gw.url)
        before = sessions_in(gw.store)
        assert "before" in before
        assert flood(gw.url) == {400, 404}
        time.sleep(2)  # let anything the flood queued settle
        assert sessions_in(gw.store) == before
        start = cpu_seconds(gw.process.pid)
        time.sleep(5)
        idle = (cpu_seconds(gw.process.pid) - start) / 5
        assert idle < 0.05, f"the idle gateway used {idle:.0%} of a core after the flood"
        after = cheap_rate(gw.url)
        assert after >= 0.8 * fresh, f"{after:.0f} calls/s after the flood, {fresh:.0f} before"
