"""Two gateways on one local store: each records its own sessions, a call for a session the other one
records is refused with a 409 in the caller's API shape and kept nowhere, and a session one gateway closed
goes on through the other one after its calls."""

from __future__ import annotations

import os
import signal
import time

import anthropic
import httpx
import live
import openai
import pytest
from deltalake import DeltaTable
from tracetap.store import StoreReader

CHAT = "/v1/chat/completions"
GOOD = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def gateways(tmp_path, tracetap_home):
    store = tmp_path / "store"
    with live.StubUpstream() as stub:
        with live.start_gateway(store, "--upstream", stub.url) as first, \
                live.start_gateway(store, "--upstream", stub.url) as second:
            yield first, second, stub


def call(gw, sid: str) -> httpx.Response:
    return httpx.post(f"{gw.url}{CHAT}", json=GOOD, headers={"x-tracetap-session": sid}, timeout=30)


def test_a_session_another_gateway_records_is_refused_in_the_callers_shape(gateways):
    first, second, stub = gateways
    assert call(first, "ours").status_code == 200
    sent = len(stub.requests)
    refused = call(second, "ours")
    assert refused.status_code == 409 and "another gateway" in refused.json()["error"]["message"]
    with pytest.raises(openai.ConflictError):
        openai.OpenAI(base_url=f"{second.url}/s/ours/v1", api_key="k", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.ConflictError):
        anthropic.Anthropic(base_url=f"{second.url}/s/ours", api_key="k", max_retries=0).messages.create(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert len(stub.requests) == sent  # nothing went upstream
    assert call(second, "theirs").status_code == 200
    rows = live.store_rows(first.store)
    assert [(row["session_id"], row["seq"]) for row in rows] == [("ours", 0), ("theirs", 0)]


def test_registering_closing_or_completing_another_gateways_session_is_a_409(gateways):
    first, second, _ = gateways
    assert call(first, "busy").status_code == 200
    control = live.control_headers()
    registered = httpx.post(f"{second.url}/sessions", json={"session_id": "busy", "task_id": "t"}, headers=control)
    closed = httpx.post(f"{second.url}/sessions/busy/close", headers=control, timeout=30)
    completed = httpx.post(f"{second.url}/sessions/busy/complete", json={"reward": 1.0}, headers=control, timeout=30)
    assert [registered.status_code, closed.status_code, completed.status_code] == [409, 409, 409]
    assert "another gateway" in closed.json()["error"]["message"]
    assert StoreReader(first.store).rewards() == []  # the refused outcome wrote nothing
    assert first.close_session("busy")["calls"] == 1  # still open there, until now
    assert StoreReader(first.store).session("busy")["task_id"] is None  # the refused registration changed nothing


def test_a_closed_session_goes_on_through_the_other_gateway(gateways):
    first, second, _ = gateways
    assert call(first, "moving").status_code == 200
    httpx.post(f"{first.url}/sessions/moving/close", headers=live.control_headers(), timeout=30).raise_for_status()
    assert call(second, "moving").status_code == 200
    assert [row["seq"] for row in live.store_rows(first.store, "session_id = 'moving'")] == [0, 1]


def test_a_killed_gateways_calls_are_committed_and_its_sessions_end(tmp_path, tracetap_home):
    """kill -9 of one gateway: another one on the store finds it dead at its next heartbeat (on one machine, its
    process is gone; elsewhere, its heartbeat is older than its --dead-after), commits its acknowledged calls,
    ends its sessions and releases them; the session then goes on there."""
    store = tmp_path / "store"
    with live.StubUpstream() as stub, live.start_gateway(store, "--upstream", stub.url, "--dead-after", "4") as taker:
        with live.start_gateway(store, "--upstream", stub.url) as doomed:
            for _ in range(3):
                assert call(doomed, "orphan").status_code == 200
            doomed.kill()
        assert wait_closed(store, "orphan")
        committed = DeltaTable(str(store / "completions")).to_pyarrow_table(columns=["session_id", "seq"])
        assert sorted(committed.column("seq").to_pylist()) == [0, 1, 2]  # in the table itself, each once
        assert not list((store / "log").glob("*.jsonl"))  # the killed gateway's log went once committed
        assert call(taker, "orphan").status_code == 200
        assert [row["seq"] for row in live.store_rows(store, "session_id = 'orphan'")] == [0, 1, 2, 3]


def test_a_gateway_stalled_past_its_dead_after_is_taken_over_and_records_nothing_more(tmp_path, tracetap_home):
    """SIGSTOP of a gateway for longer than its --dead-after: the other one takes its session over (ends it);
    woken up, the stalled one refuses calls (its sessions may be another gateway's now) and the session goes on
    through the other one, with no seq given twice."""
    store = tmp_path / "store"
    with live.StubUpstream() as stub, live.start_gateway(store, "--upstream", stub.url, "--dead-after", "4") as taker, \
            live.start_gateway(store, "--upstream", stub.url, "--dead-after", "2") as stalled:
        assert call(stalled, "held").status_code == 200
        os.kill(stalled.process.pid, signal.SIGSTOP)
        try:
            assert wait_closed(store, "held")
        finally:
            os.kill(stalled.process.pid, signal.SIGCONT)
        refused = call(stalled, "held")
        assert refused.status_code == 500
        assert refused.json()["error"]["message"] == "the gateway could not record this call"
        assert call(taker, "held").status_code == 200
        assert [row["seq"] for row in live.store_rows(store, "session_id = 'held'")] == [0, 1]


def wait_closed(store, sid: str, timeout: float = 30) -> bool:
    """Whether the session's row says closed within `timeout` seconds (a takeover ends it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = StoreReader(store).session(sid)
        if row is not None and row["status"] == "closed":
            return True
        time.sleep(0.2)
    return False
