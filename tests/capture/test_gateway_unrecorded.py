"""Calls the gateway answers without recording a completion (probes, model lists, token counts, client
errors) are counted per session in `sessions.unrecorded_json` and shown by `tracetap sessions`."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import live
import openai
import pytest
from click.testing import CliRunner

from tracetap.cli import cli


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with live.StubUpstream() as stub:
        stub.plans["unrec-chat"] = live.Plan("chat_basic")
        process = live.start_gateway(tmp_path_factory.mktemp("unrecorded") / "store", "--upstream", stub.url)
        yield process
        process.stop()


def sessions(gw, expected: dict[str, dict], timeout: float = 10.0) -> dict[str, dict]:
    """`tracetap sessions --json` by session, once the expected counts are saved (rows are rewritten
    shortly after a call, in batches) or the timeout passed."""
    deadline = time.monotonic() + timeout
    while True:
        result = CliRunner().invoke(cli, ["sessions", "--store", str(gw.store), "--json"], catch_exceptions=False)
        rows = {row["session"]: row for row in json.loads(result.stdout)}
        saved = {sid: rows[sid]["unrecorded"] for sid in expected if sid in rows}
        if saved == expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def test_unrecorded_calls_are_counted_per_session(gw):
    claude = anthropic.Anthropic(base_url=gw.url, api_key="sk-tap-unrec-count")
    for _ in range(2):
        claude.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    gpt = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", default_headers={"x-tracetap-session": "unrec-chat"})
    assert [model.id for model in gpt.models.list()]
    gpt.models.retrieve("m")
    gpt.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        gpt.chat.completions.create(model="m", messages="not a list")
    probe = {"x-tracetap-session": "unrec-probe"}
    assert httpx.head(gw.url + "/", headers=probe).status_code == 200
    assert httpx.get(gw.url + "/", headers=probe).status_code == 200
    assert httpx.get(gw.url + "/nowhere", headers=probe).status_code == 404

    rows = sessions(gw, {"sk-tap-unrec-count": {"count_tokens": 2}, "unrec-chat": {"models": 2, "client_error": 1},
                         "unrec-probe": {"probe": 2, "client_error": 1}})
    assert rows["sk-tap-unrec-count"]["unrecorded"] == {"count_tokens": 2}
    assert rows["unrec-chat"]["unrecorded"] == {"models": 2, "client_error": 1}
    assert rows["unrec-probe"]["unrecorded"] == {"probe": 2, "client_error": 1}
    assert [rows[sid]["calls"] for sid in ("sk-tap-unrec-count", "unrec-chat", "unrec-probe")] == [0, 1, 0]
    assert [row["session_id"] for row in live.store_rows(gw.store)] == ["unrec-chat"]


def test_the_sessions_table_shows_the_counts(gw):
    httpx.head(gw.url + "/", headers={"x-tracetap-session": "unrec-table"})
    sessions(gw, {"unrec-table": {"probe": 1}})
    output = CliRunner().invoke(cli, ["sessions", "--store", str(gw.store)], catch_exceptions=False).stdout
    header, line = output.splitlines()[0], next(row for row in output.splitlines() if row.startswith("unrec-table"))
    assert "unrecorded" in header.split() and "probe=1" in line.split()
