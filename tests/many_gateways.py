"""Four gateway processes recording into one store at once (the local disk: tests/capture/test_four_gateways.py;
a bucket: tests/objstore): 64 sessions each, called and closed by client threads, while SQL readers and a
build read the store and the gateways' compactors commit; one gateway is killed with -9 mid-run. `run`
drives it; `check_store` checks what the store holds afterwards, reading its Delta tables directly.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import httpx
import live
from deltalake import DeltaTable
from tracetap.builders.runner import build
from tracetap.store import StoreReader, connect, owners
from tracetap.store.location import ObjectPath, StorePath
from tracetap.store.paths import live_files, log_segments

from tracetap.launch import GatewayProcess

GATEWAYS, SESSIONS, CALLS = 4, 64, 3
CLIENTS = 32  # client threads, over every gateway's sessions at once
DOOMED = GATEWAYS - 1  # the gateway killed once a third of its calls were answered
CHAT = "/v1/chat/completions"
Start = Callable[[], GatewayProcess]  # starts one more gateway on the store


@dataclass
class Run:
    """What the clients and readers saw."""

    store: StorePath
    gateways: list[GatewayProcess]
    acked: dict[str, str] = field(default_factory=dict)  # completion id -> session
    closed: set[str] = field(default_factory=set)  # sessions whose close was answered
    reads: Counter[str] = field(default_factory=Counter)
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def acknowledged(self, prefix: str = "") -> set[str]:
        with self.lock:
            return {cid for cid, sid in self.acked.items() if sid.startswith(prefix)}

    def session(self, gateway: int, sid: str) -> None:
        """CALLS calls then a close; stops quietly once its gateway is gone (killed)."""
        url = self.gateways[gateway].url
        body = {"model": "m", "messages": [{"role": "user", "content": sid}], "max_tokens": 8}
        with httpx.Client(timeout=120, headers={"x-tracetap-session": sid}) as http:
            try:
                for _ in range(CALLS):
                    reply = http.post(f"{url}{CHAT}", json=body)
                    assert reply.status_code == 200, reply.text
                    with self.lock:
                        self.acked[reply.json()["id"]] = sid
                http.post(f"{url}/sessions/{sid}/close", headers=live.control_headers()).raise_for_status()
            except httpx.TransportError:
                assert gateway == DOOMED, f"gateway {gateway} went away"
                return
        with self.lock:
            self.closed.add(sid)


def sid(gateway: int, n: int) -> str:
    return f"g{gateway}-s{n}"


def _read(run: Run) -> None:
    """SQL reads until the run stops: no row twice, none acknowledged missing."""
    while not run.stop.is_set():
        before = run.acknowledged()
        with connect(run.store) as con:
            rows = con.execute("SELECT session_id, seq, completion_id FROM completions").fetchall()
        assert len({(s, seq) for s, seq, _ in rows}) == len(rows), "a row was read twice"
        assert before <= {cid for *_, cid in rows}, "an acknowledged call is missing"
        run.reads["sql"] += 1


def _build(run: Run) -> None:
    """prefix_merging builds until the run stops."""
    while not run.stop.is_set():
        build(run.store, "prefix_merging")
        run.reads["build"] += 1


def _guarded(run: Run, work: Callable[[Run], None]) -> Callable[[], None]:
    def guarded() -> None:
        try:
            work(run)
        except BaseException as error:  # reported by check_run
            run.errors.append(error)
            run.stop.set()
    return guarded


@contextmanager
def gateways(start: Start) -> Iterator[list[GatewayProcess]]:
    """GATEWAYS gateways on the store, each stopped by its pid at the end."""
    with ExitStack() as stack:
        yield [stack.enter_context(start()) for _ in range(GATEWAYS)]


def contested(run: Run) -> httpx.Response:
    """A call for a session gateway 0 records, sent to gateway 1 (the session is closed on gateway 0 after)."""
    first, second = run.gateways[0].url, run.gateways[1].url
    body = {"model": "m", "messages": [{"role": "user", "content": "contested"}]}
    headers = {"x-tracetap-session": "contested"}
    answered = httpx.post(f"{first}{CHAT}", json=body, headers=headers, timeout=60)
    refused = httpx.post(f"{second}{CHAT}", json=body, headers=headers, timeout=60)
    with run.lock:
        run.acked[answered.json()["id"]] = "contested"
    httpx.post(f"{first}/sessions/contested/close", headers=live.control_headers(), timeout=60).raise_for_status()
    with run.lock:
        run.closed.add("contested")
    return refused


def run(store: StorePath, started: list[GatewayProcess]) -> tuple[Run, httpx.Response]:
    """Every gateway's sessions at once under readers and a build; the doomed gateway is killed once a third
    of its calls were answered; returns once the takeover ended its sessions. The gateways still run."""
    state = Run(store, started)
    readers = [threading.Thread(target=_guarded(state, work)) for work in (_read, _build)]
    for reader in readers:
        reader.start()
    refused = contested(state)
    work = [(gateway, sid(gateway, n)) for n in range(SESSIONS) for gateway in range(GATEWAYS)]
    with ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(state.session, *job) for job in work]
        _kill_when(state, len(work) // GATEWAYS * CALLS // 3)
        for future in futures:
            future.result()
    _wait_for_takeover(state)
    state.stop.set()
    for reader in readers:
        reader.join(300)
    return state, refused


def _kill_when(run: Run, answered: int) -> None:
    deadline = time.monotonic() + 300
    while len(run.acknowledged(f"g{DOOMED}-")) < answered and time.monotonic() < deadline and not run.errors:
        time.sleep(0.05)
    run.gateways[DOOMED].kill()


def _wait_for_takeover(run: Run, timeout: float = 120) -> None:
    """Until a live gateway ended every session of the killed one (all those the store shows, and at least
    every one with an answered call)."""
    with run.lock:
        answered = {sid for sid in run.acked.values() if sid.startswith(f"g{DOOMED}-")}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = {row["session_id"]: row["status"] for row in StoreReader(run.store).sessions()}
        doomed = {sid for sid in rows if sid.startswith(f"g{DOOMED}-")} | answered
        if all(rows.get(sid) == "closed" for sid in doomed):
            return
        time.sleep(0.5)
    raise AssertionError(f"the killed gateway's sessions were not ended: {sorted(doomed - set(rows))}")


def table(store: StorePath, name: str, columns: list[str]) -> dict[str, list]:
    """A table's columns as deltalake itself reads them (no tracetap reader in between)."""
    options = {"AWS_ALLOW_HTTP": "true"} if isinstance(store, ObjectPath) else None
    return DeltaTable(f"{store}/{name}", storage_options=options).to_pyarrow_table(columns=columns).to_pydict()


def check_store(run: Run) -> None:
    """Every acknowledged call once, seqs unique and gap-free per session, every session closed once, none
    owned, no log, live file or heartbeat left: the store at rest after the gateways stopped."""
    assert run.errors == [] and run.reads["sql"] >= 3 and run.reads["build"] >= 1, (run.errors, run.reads)
    calls = table(run.store, "completions", ["session_id", "seq", "completion_id"])
    ids = Counter(calls["completion_id"])
    assert [cid for cid in run.acknowledged() if ids[cid] != 1] == []
    seqs = defaultdict(list)
    for session, seq in zip(calls["session_id"], calls["seq"], strict=True):
        seqs[session].append(seq)
    assert {s: sorted(found) for s, found in seqs.items()} == {s: list(range(len(found))) for s, found in seqs.items()}
    sessions = table(run.store, "sessions", ["session_id", "status", "completions"])
    assert Counter(sessions["session_id"]) == Counter(set(seqs))  # each session with a call, one row each
    rows = dict(zip(sessions["session_id"], zip(sessions["status"], sessions["completions"], strict=True), strict=True))
    assert {s: rows[s] for s in seqs} == {s: ("closed", len(found)) for s, found in seqs.items()}
    assert run.closed <= set(seqs) and len(run.closed) >= (GATEWAYS - 1) * SESSIONS
    assert SESSIONS * CALLS // 3 <= len(run.acknowledged(f"g{DOOMED}-")) < SESSIONS * CALLS  # killed mid-run
    assert [s for s in seqs if not owners.last_entry(run.store, s).released] == []
    assert (log_segments(run.store), live_files(run.store), owners.heartbeat_writers(run.store)) == ([], [], [])
