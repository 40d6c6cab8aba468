"""Agent-posted outcomes on a real gateway: `POST /sessions/{id}/complete` writes a `posted` reward, closes
the session and is idempotent; `/sessions/{id}/v1` works as a base URL for the official SDKs."""

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


def complete(gw, sid: str, body: object) -> httpx.Response:
    return httpx.post(f"{gw.url}/sessions/{sid}/complete", json=body, timeout=30)


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
    openai.OpenAI(base_url=f"{gw.url}/sessions/posted-2/v1", api_key="k", max_retries=0).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}])
    body = {"reward": 0.75, "trace_rewards": [0.75], "status": "completed",
            "details": {"tests": 3, "api_key": "sk-do-not-store-me"}}
    reply = complete(gw, "posted-2", body)
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

    again = complete(gw, "posted-2", body)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert len(StoreReader(gw.store).rewards("posted", ["posted-2"])) == 1
    other = complete(gw, "posted-2", {**body, "reward": 0.0})
    assert other.status_code == 409 and "already has a posted outcome" in other.json()["error"]["message"]
    assert StoreReader(gw.store).rewards("posted", ["posted-2"])[0]["reward"] == 0.75


def test_a_posted_reward_joins_the_sessions_traces_like_an_evaluators(gw, tmp_path):
    openai.OpenAI(base_url=f"{gw.url}/sessions/posted-3/v1", api_key="k", max_retries=0).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}])
    assert complete(gw, "posted-3", {"reward": 1.0}).status_code == 200
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


def test_an_outcome_for_an_unknown_session_is_a_404(gw):
    assert complete(gw, "never-seen", {"reward": 1}).status_code == 404
