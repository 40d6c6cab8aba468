"""`POST /sessions` on a real gateway: a rollout names a session's task and harness before any call."""

from __future__ import annotations

import json

import httpx
import live
import openai
import pytest
from tracetap.store import connect


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    root = tmp_path_factory.mktemp("register")
    with live.StubUpstream() as stub, live.start_gateway(root / "store", "--upstream", stub.url) as process:
        yield process


def session_row(store, sid: str) -> dict | None:
    with connect(store) as con:
        cursor = con.execute("SELECT * FROM sessions WHERE session_id = ?", [sid])
        names = [column[0] for column in cursor.description]
        found = cursor.fetchall()
    return dict(zip(names, found[0], strict=True)) if found else None


def test_registered_session_carries_task_and_harness_before_any_call(gw):
    body = {"session_id": "rollout-plain-7", "task_id": "fix-calc", "harness": "builtin",
            "metadata": {"workspace": "/tmp/ws", "sample_index": 2}}
    reply = httpx.post(f"{gw.url}/sessions", json=body)
    assert reply.status_code == 200
    assert reply.json() == {"session_id": "rollout-plain-7", "task_id": "fix-calc", "harness": "builtin",
                            "status": "open"}
    row = session_row(gw.store, "rollout-plain-7")
    assert (row["task_id"], row["harness"], row["completions"]) == ("fix-calc", "builtin", 0)
    assert json.loads(row["metadata_json"]) == {"workspace": "/tmp/ws", "sample_index": 2}

    # a registered id binds as a plain API key (no sk-tap- prefix needed), and the row keeps its labels
    chat = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="rollout-plain-7", max_retries=0)
    chat.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert [r["session_id"] for r in live.store_rows(gw.store)] == ["rollout-plain-7"]
    gw.close_session("rollout-plain-7")
    row = session_row(gw.store, "rollout-plain-7")
    assert (row["task_id"], row["harness"], row["completions"]) == ("fix-calc", "builtin", 1)


BAD_BODIES = [
    (b"{not json", 400, "not valid JSON"),
    (b'["sk-tap-x"]', 400, "JSON object"),
    (b'{"task_id": "t"}', 422, "session_id is required"),
    (b'{"session_id": "../escape"}', 422, "session_id"),
    (b'{"session_id": "sk-tap-ok", "task_id": 5}', 422, "task_id"),
    (b'{"session_id": "sk-tap-ok", "harness": "  "}', 422, "harness"),
    (b'{"session_id": "sk-tap-ok", "metadata": [1]}', 422, "metadata"),
    (b'{"session_id": "sk-tap-ok", "sessionid": "typo"}', 422, "unknown field(s): sessionid"),
]


def test_bad_registrations_are_refused_and_write_nothing(gw):
    before = live.settled_snapshot(gw.store)
    for body, status, message in BAD_BODIES:
        reply = httpx.post(f"{gw.url}/sessions", content=body, headers={"content-type": "application/json"})
        assert (reply.status_code, message in reply.json()["error"]["message"]) == (status, True), body
    assert live.settled_snapshot(gw.store) == before
