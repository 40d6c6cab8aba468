"""Posted outcomes on a real gateway: `POST /sessions/{id}/complete` with the session's outcome token (the
environment's, never the harness's) or the control token writes a `posted` reward, closes the session and is
idempotent; anyone else learns nothing. `/sessions/{id}/v1` works as a base URL for the official SDKs."""

from __future__ import annotations

import json
import subprocess
import sys

import anthropic
import httpx
import live
import openai
import pyarrow.parquet as pq
import pytest
from google import genai
from google.genai import types
from tracetap.store import StoreReader, connect

SCRIPT = [{"content": "All tests pass."}] * 8


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with live.scripted_gateway(tmp_path_factory.mktemp("outcome"), SCRIPT) as process:
        yield process


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def complete(gw, sid: str, body: object, token: str | None = None) -> httpx.Response:
    headers = live.control_headers() if token is None else bearer(token)
    return httpx.post(f"{gw.url}/sessions/{sid}/complete", json=body, headers=headers, timeout=30)


def registered(gw, sid: str) -> dict:
    """A registered session with one call made with its key: {session_key, outcome_token}."""
    answer = live.register_session(gw.url, sid)
    openai.OpenAI(base_url=f"{gw.url}/v1", api_key=answer["session_key"], max_retries=0).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}])
    return answer


def test_sessions_path_is_a_base_url_for_the_sdks(gw):
    chat = openai.OpenAI(base_url=f"{gw.url}/sessions/posted-1/v1", api_key="any-key", max_retries=0)
    assert chat.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}]).choices
    claude = anthropic.Anthropic(base_url=f"{gw.url}/sessions/posted-1", api_key="any-key", max_retries=0)
    assert claude.messages.create(model="m", max_tokens=32, messages=[{"role": "user", "content": "go"}]).content
    gemini = genai.Client(api_key="any-key", http_options=types.HttpOptions(base_url=f"{gw.url}/sessions/posted-1"))
    assert gemini.models.generate_content(model="gemini-2.5-flash", contents="go").text
    rows = live.store_rows(gw.store, "session_id = 'posted-1'")
    assert [(r["api"], json.loads(r["metadata_json"])["session_source"]) for r in rows] == [
        ("openai_chat", "path"), ("anthropic_messages", "path"), ("gemini", "path")]


def test_a_posted_outcome_is_a_reward_row_and_closes_the_session(gw):
    token = registered(gw, "posted-2")["outcome_token"]
    body = {"reward": 0.75, "trace_rewards": [0.75], "status": "completed",
            "details": {"tests": 3, "api_key": "sk-do-not-store-me"}}
    reply = complete(gw, "posted-2", body, token)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"session_id": "posted-2", "status": "closed", "evaluator": "posted", "reward": 0.75,
                            "duplicate": False}
    [reward] = StoreReader(gw.store).rewards("posted", ["posted-2"])
    assert (reward["reward"], reward["trace_rewards"]) == (0.75, [0.75])
    details = json.loads(reward["details_json"])
    assert details["status"] == "completed" and details["details"]["tests"] == 3
    assert "sk-do-not-store-me" not in reward["details_json"]
    with connect(gw.store) as con:
        assert con.execute("SELECT status FROM sessions WHERE session_id = 'posted-2'").fetchone() == ("closed",)

    again = complete(gw, "posted-2", body, token)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert len(StoreReader(gw.store).rewards("posted", ["posted-2"])) == 1
    other = complete(gw, "posted-2", {**body, "reward": 0.0}, token)
    assert other.status_code == 409 and "already has a posted outcome" in other.json()["error"]["message"]
    assert StoreReader(gw.store).rewards("posted", ["posted-2"])[0]["reward"] == 0.75


def test_a_posted_reward_joins_the_sessions_traces_like_an_evaluators(gw, tmp_path):
    token = registered(gw, "posted-3")["outcome_token"]
    assert complete(gw, "posted-3", {"reward": 1.0}, token).status_code == 200
    out = tmp_path / "dataset.parquet"
    for args in (["build", "--builder", "per_request", "--session", "posted-3"],
                 ["export", "--builder", "per_request", "--format", "parquet", "--evaluator", "posted",
                  "--out", str(out)]):
        done = subprocess.run([sys.executable, "-m", "tracetap.cli", *args, "--store", str(gw.store)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    table = pq.read_table(out).to_pylist()
    assert {row["session_id"]: row["reward"] for row in table}["posted-3"] == 1.0


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"reward": "high"}, 422, "reward: must be a finite number"),
    ({}, 422, "reward: must be a finite number"),
    ({"reward": 1, "trace_rewards": [1, "x"]}, 422, "trace_rewards.1: must be a finite number"),
    ({"reward": 1, "details": [1]}, 422, "details: must be a JSON object"),
    ({"reward": 1, "score": 2}, 422, "unknown field(s): score"),
    ({"reward": 1, "status": ""}, 422, "status: must be printable text"),
    ([1], 400, "must be a JSON object"),
])
def test_bad_outcome_bodies_are_refused_naming_the_field(gw, body, status, message):
    openai.OpenAI(base_url=f"{gw.url}/sessions/posted-bad/v1", api_key="k", max_retries=0).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}])
    reply = complete(gw, "posted-bad", body)
    assert reply.status_code == status and message in reply.json()["error"]["message"]
    assert StoreReader(gw.store).rewards("posted", ["posted-bad"]) == []


def test_an_outcome_for_an_unknown_session_is_a_404_for_the_trainer(gw):
    assert complete(gw, "never-seen", {"reward": 1}).status_code == 404


def test_no_one_but_the_environment_and_the_trainer_posts_an_outcome(gw):
    """The harness's own key, another session's outcome token, a made-up token or none: one 401 for a session
    that exists and one that does not, and no reward stored."""
    mine, other = registered(gw, "posted-mine"), registered(gw, "posted-other")
    attempts = [(sid, token) for sid in ("posted-mine", "never-was") for token in
                (mine["session_key"], other["outcome_token"], "tapout-" + "x" * 43, "")]
    answers = [complete(gw, sid, {"reward": 1.0}, token) for sid, token in attempts]
    answers += [httpx.post(f"{gw.url}/sessions/{sid}/close", headers=bearer(token)) for sid, token in attempts]
    assert {(a.status_code, a.json()["error"]["message"]) for a in answers} == {
        (401, "this endpoint needs the session's outcome token or the control token")}
    assert StoreReader(gw.store).rewards("posted", ["posted-mine"]) == []
    assert complete(gw, "posted-mine", {"reward": 0.5}, mine["outcome_token"]).status_code == 200
