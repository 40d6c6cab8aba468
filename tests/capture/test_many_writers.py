"""Two gateways on one local store: each records its own sessions, a call for a session the other one
records is refused with a 409 in the caller's API shape and kept nowhere, and a session one gateway closed
goes on through the other one after its calls."""

from __future__ import annotations

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


def test_registering_or_closing_another_gateways_session_is_a_409(gateways):
    first, second, _ = gateways
    assert call(first, "busy").status_code == 200
    control = live.control_headers()
    registered = httpx.post(f"{second.url}/sessions", json={"session_id": "busy", "task_id": "t"}, headers=control)
    closed = httpx.post(f"{second.url}/sessions/busy/close", headers=control, timeout=30)
    assert [registered.status_code, closed.status_code] == [409, 409]
    assert "another gateway" in closed.json()["error"]["message"]
    row = StoreReader(first.store).session("busy")
    assert row is not None and row["status"] != "closed" and row["task_id"] is None  # neither one changed it


def test_a_closed_session_goes_on_through_the_other_gateway(gateways):
    first, second, _ = gateways
    assert call(first, "moving").status_code == 200
    httpx.post(f"{first.url}/sessions/moving/close", headers=live.control_headers(), timeout=30).raise_for_status()
    assert call(second, "moving").status_code == 200
    assert [row["seq"] for row in live.store_rows(first.store, "session_id = 'moving'")] == [0, 1]


def test_a_killed_gateways_calls_are_committed_and_its_sessions_end(tmp_path, tracetap_home):
    """kill -9 of one gateway: another one on the store finds it dead once its heartbeat is --dead-after old,
    commits its acknowledged calls, ends its sessions and releases them; the session then goes on there."""
    store = tmp_path / "store"
    with live.StubUpstream() as stub, live.start_gateway(store, "--upstream", stub.url, "--dead-after", "2") as taker:
        with live.start_gateway(store, "--upstream", stub.url) as doomed:
            for _ in range(3):
                assert call(doomed, "orphan").status_code == 200
            doomed.kill()

        def ended() -> bool:
            row = StoreReader(store).session("orphan")
            return row is not None and row["status"] == "closed"

        deadline = time.monotonic() + 30
        while not ended() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ended()
        committed = DeltaTable(str(store / "completions")).to_pyarrow_table(columns=["session_id", "seq"])
        assert sorted(committed.column("seq").to_pylist()) == [0, 1, 2]  # in the table itself, each once
        assert not list((store / "log").glob("*.jsonl"))  # the killed gateway's log went once committed
        assert call(taker, "orphan").status_code == 200
        assert [row["seq"] for row in live.store_rows(store, "session_id = 'orphan'")] == [0, 1, 2, 3]
