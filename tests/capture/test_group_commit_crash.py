"""Group commit under `kill -9`: 32 sessions call a gateway subprocess at once (over the fixture-replaying
stub upstream: the embedded engine answers ~10 calls/s here) while readers query the store and the
sessions' closes (and idle compaction) commit the log to the completions Delta table; then the gateway is
killed.

The long version (marker `soak`, run by scripts/test.sh) kills it after ~2,000 calls instead of ~130.
Every call whose answer the client got is in the store after the restart (0 lost), every file is
readable, the dead writer's log is recovered (its segments gone) and the restarted gateway appends
after it; no read during the run ever fails, sees a row twice or misses an acknowledged one.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx
import live
import pyarrow.parquet as pq
import pytest
from tracetap.store import connect
from tracetap.store.commit_log import END_MARK
from tracetap.store.paths import log_segments
from tracetap.store.reading import read_completions

SESSIONS = 32
CLOSE_EVERY = 4  # a client closes its session after this many calls: compaction runs under the readers
KEYS_SQL = "SELECT session_id, seq, completion_id FROM completions"


class Run:
    """Client threads (one per session, calling in a loop) and what they were acknowledged."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.acked: dict[str, tuple[str, int]] = {}  # completion id -> (session, call number)
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def client(self, sid: str) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": sid}], "max_tokens": 8}
        with httpx.Client(timeout=30, headers={"x-tracetap-session": sid}) as http:
            for call in range(10_000):
                if self.stop.is_set():
                    return
                try:
                    reply = http.post(f"{self.url}/v1/chat/completions", json=body)
                except httpx.HTTPError:
                    return  # the gateway died with this call in flight
                assert reply.status_code == 200, reply.text
                with self.lock:
                    self.acked[reply.json()["id"]] = (sid, call)
                if call % CLOSE_EVERY == CLOSE_EVERY - 1 and not self.close(http, sid):
                    return

    def close(self, http: httpx.Client, sid: str) -> bool:
        """Close the session (the gateway compacts it; its next call opens it again); False once the
        gateway is gone."""
        try:
            http.post(f"{self.url}/sessions/{sid}/close", headers=live.control_headers()).raise_for_status()
        except httpx.TransportError:
            return False
        return True

    def acknowledged(self) -> set[str]:
        with self.lock:
            return set(self.acked)


def sql_read(store: Path) -> list[tuple[str, int, str]]:
    return connect(store).execute(KEYS_SQL).fetchall()


def python_read(store: Path) -> list[tuple[str, int, str]]:
    tables = read_completions(store, [f"gc-{n}" for n in range(SESSIONS)], ["session_id", "seq", "completion_id"])
    return [(r["session_id"], r["seq"], r["completion_id"]) for table in tables.values() for r in table.to_pylist()]


def reader(store: Path, run: Run, errors: list[BaseException], reads: list[int]) -> None:
    """Read the store in turns through SQL and Python until the run stops; check each answer."""
    turn = 0
    while not run.stop.is_set():
        before = run.acknowledged()
        try:
            rows = (sql_read if turn % 2 == 0 else python_read)(store)
            keys = [(sid, seq) for sid, seq, _ in rows]
            assert len(keys) == len(set(keys)), "a row was read twice"
            assert before <= {cid for _, _, cid in rows}, "an acknowledged row is missing"
        except BaseException as error:  # reported by the test
            errors.append(error)
            return
        reads[turn % 2] += 1
        turn += 1


def check_segments(store: Path) -> None:
    """Every line of every segment is a whole row, but for at most a torn last line."""
    for segment in log_segments(store):
        lines = segment.read_bytes().split(b"\n")  # the last piece: empty, or a torn tail
        assert all(line.endswith(END_MARK) for line in lines[:-1]), segment


@pytest.mark.parametrize("per_session", [pytest.param(4, id="short"),
                                         pytest.param(60, id="long", marks=pytest.mark.soak)])
def test_kill_9_under_32_sessions_loses_no_acknowledged_call(gateway, stub_upstream, tmp_path, per_session):
    """The kill comes once `per_session` calls a session (on average) were answered."""
    store, errors, reads, acked = tmp_path / "store", [], [0, 0], per_session * SESSIONS
    dying = gateway("--upstream", stub_upstream.url, "--idle-compact", "0.2", store=store)
    run = Run(dying.url)
    clients = [threading.Thread(target=run.client, args=(f"gc-{n}",)) for n in range(SESSIONS)]
    readers = [threading.Thread(target=reader, args=(store, run, errors, reads))]
    for thread in clients + readers:
        thread.start()
    deadline = time.monotonic() + 60 + per_session
    while (len(run.acknowledged()) < acked or min(reads) < 3) and time.monotonic() < deadline and not errors:
        time.sleep(0.05)
    dying.kill()
    run.stop.set()
    for thread in clients + readers:
        thread.join(60)
    assert errors == []
    assert len(run.acknowledged()) >= acked and min(reads) >= 3
    assert any(live.committed_seqs(store, f"gc-{n}") for n in range(SESSIONS))  # compactions ran under the reads

    for path in store.rglob("*.parquet"):
        pq.read_table(path)  # every file under a final name is complete
    check_segments(store)
    dead_segments = set(log_segments(store))
    stored = {cid: (sid, seq) for sid, seq, cid in sql_read(store)}
    assert run.acknowledged() <= set(stored), "acknowledged calls lost before the restart"

    again = gateway("--upstream", stub_upstream.url, store=store)
    assert not dead_segments & set(log_segments(store)), "the dead writer's log was not recovered"
    after = {cid: (sid, seq) for sid, seq, cid in sql_read(store)}
    assert after == stored
    by_session = defaultdict(list)
    for sid, seq in after.values():
        by_session[sid].append(seq)
    assert all(sorted(seqs) == list(range(len(seqs))) for seqs in by_session.values())
    reply = httpx.post(f"{again.url}/v1/chat/completions", headers={"x-tracetap-session": "gc-0"},
                       json={"model": "m", "messages": [{"role": "user", "content": "again"}]}, timeout=30)
    new = {cid: seq for sid, seq, cid in sql_read(store)}[reply.json()["id"]]
    assert new == len(by_session["gc-0"])  # the restarted writer appends after what the log held

