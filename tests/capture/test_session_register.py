"""`POST /sessions` on a real gateway: a rollout names a session's task and harness before any call, with the
control token, and gets the session's two secrets; the first registration wins."""

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


def register(gw, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{gw.url}/sessions", json=body, headers=live.control_headers() if headers is None else headers)


def test_registered_session_carries_task_and_harness_before_any_call(gw):
    body = {"session_id": "rollout-plain-7", "task_id": "fix-calc", "harness": "builtin",
            "metadata": {"workspace": "/tmp/ws", "sample_index": 2}}
    reply = register(gw, body)
    assert reply.status_code == 200
    answer = reply.json()
    key, token = answer.pop("session_key"), answer.pop("outcome_token")
    assert answer == {"session_id": "rollout-plain-7", "task_id": "fix-calc", "harness": "builtin",
                      "status": "open", "registered": True}
    assert key.startswith("sk-tapkey-") and token.startswith("tapout-") and key != token
    row = session_row(gw.store, "rollout-plain-7")
    assert (row["task_id"], row["harness"], row["completions"]) == ("fix-calc", "builtin", 0)
    assert json.loads(row["metadata_json"]) == {"workspace": "/tmp/ws", "sample_index": 2}

    # the session key binds as a plain API key, and the row keeps its labels; the store keeps no secret
    chat = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
    chat.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert [r["session_id"] for r in live.store_rows(gw.store)] == ["rollout-plain-7"]
    gw.close_session("rollout-plain-7")
    row = session_row(gw.store, "rollout-plain-7")
    assert (row["task_id"], row["harness"], row["completions"]) == ("fix-calc", "builtin", 1)
    stored = b"".join(path.read_bytes() for path in gw.store.rglob("*") if path.is_file())
    assert key.encode() not in stored and token.encode() not in stored


def test_the_first_registration_wins(gw):
    body = {"session_id": "first-wins", "task_id": "t", "metadata": {"max_staleness": 0}}
    assert register(gw, body).json()["registered"] is True
    again = register(gw, body)
    assert again.status_code == 200 and again.json()["registered"] is False
    assert "session_key" not in again.json()  # secrets are shown once
    before = live.settled_snapshot(gw.store)
    changed = register(gw, {**body, "metadata": {"max_staleness": 1000}})
    assert changed.status_code == 409 and "registered already" in changed.json()["error"]["message"]
    assert live.settled_snapshot(gw.store) == before
    assert json.loads(session_row(gw.store, "first-wins")["metadata_json"]) == {"max_staleness": 0}


def test_a_registrant_may_bring_its_secrets_and_retry_with_them(gw):
    secrets = {"session_key": "sk-tapkey-" + "k" * 40, "outcome_token": "tapout-" + "o" * 40}
    body = {"session_id": "brought-keys", "task_id": "t", **secrets}
    assert register(gw, body).json()["registered"] is True
    assert register(gw, body).json()["registered"] is True  # the same registration: idempotent
    other = register(gw, {**body, "session_key": "sk-tapkey-" + "x" * 40})
    assert other.status_code == 409


def test_registering_without_the_control_token_tells_nothing(gw):
    register(gw, {"session_id": "exists-1", "task_id": "t"})
    answers = [register(gw, {"session_id": sid, "task_id": "t"}, headers)
               for sid in ("exists-1", "never-registered") for headers in ({}, {"authorization": "Bearer nope"})]
    assert {(a.status_code, a.json()["error"]["message"]) for a in answers} == {
        (401, "this endpoint needs the control token (Authorization: Bearer <token>)")}
    assert session_row(gw.store, "never-registered") is None


BAD_BODIES = [
    (b"{not json", 400, "not valid JSON"),
    (b'["sk-tap-x"]', 400, "JSON object"),
    (b'{"task_id": "t"}', 422, "session_id is required"),
    (b'{"session_id": "../escape"}', 422, "session_id"),
    (b'{"session_id": "sk-tap-ok", "task_id": 5}', 422, "task_id"),
    (b'{"session_id": "sk-tap-ok", "harness": "  "}', 422, "harness"),
    (b'{"session_id": "sk-tap-ok", "metadata": [1]}', 422, "metadata"),
    (b'{"session_id": "sk-tap-ok", "sessionid": "typo"}', 422, "unknown field(s): sessionid"),
    (b'{"session_id": "sk-tap-ok", "session_key": "short"}', 422, "session_key: must be sk-tapkey-"),
    (b'{"session_id": "sk-tap-ok", "outcome_token": "sk-tapkey-' + b"k" * 40 + b'"}', 422, "outcome_token"),
]


def test_bad_registrations_are_refused_and_write_nothing(gw):
    before = live.settled_snapshot(gw.store)
    for body, status, message in BAD_BODIES:
        reply = httpx.post(f"{gw.url}/sessions", content=body,
                           headers={"content-type": "application/json", **live.control_headers()})
        assert (reply.status_code, message in reply.json()["error"]["message"]) == (status, True), body
    assert live.settled_snapshot(gw.store) == before
