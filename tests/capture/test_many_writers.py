"""Two gateways on one local store: each records its own sessions, a call for a session the other one
records is refused with a 409 in the caller's API shape and kept nowhere, and a session one gateway closed
goes on through the other one after its calls."""

from __future__ import annotations

import anthropic
import httpx
import live
import openai
import pytest

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


def test_a_closed_session_goes_on_through_the_other_gateway(gateways):
    first, second, _ = gateways
    assert call(first, "moving").status_code == 200
    httpx.post(f"{first.url}/sessions/moving/close", headers=live.control_headers(), timeout=30).raise_for_status()
    assert call(second, "moving").status_code == 200
    assert [row["seq"] for row in live.store_rows(first.store, "session_id = 'moving'")] == [0, 1]
