"""Every call the upstream answered is recorded, and nothing that is not training data is stored `ok`.

A real gateway process in front of a stub upstream that answers each session with a crafted body:
unusable answers (wrong token types, objects where strings belong) are a 502 in the caller's API
shape and an `upstream_error` row keeping the body; answers without training data are served and
recorded `degraded`, which the builders leave out and count, and `error_rates` shows; text with lone
surrogates is stored escaped; a 429 keeps its Retry-After.
"""

from __future__ import annotations

import copy
import json

import anthropic
import httpx
import live
import openai
import pytest
from tracetap.builders import build
from tracetap.queries import run_query
from tracetap.store import connect

CALL = {"model": "gpt-4o", "messages": [{"role": "user", "content": "List the files."}], "max_tokens": 20}
GOOD = json.loads(live.fixture_body("chat_tools_auto_call"))


def answer(body: object, status: int = 200, headers: dict | None = None, raw: bytes | None = None) -> live.Plan:
    payload = raw if raw is not None else json.dumps(body).encode()
    return live.Plan(answer=lambda _request: (status, payload, headers or {}))


def good_with(change) -> dict:
    body = copy.deepcopy(GOOD)
    change(body, body["choices"][0])
    return body


UNUSABLE = {
    "ids-strings": good_with(lambda b, c: c.update(token_ids=["a"])),
    "ids-null": good_with(lambda b, c: c.update(token_ids=[None, 1])),
    "ids-huge": good_with(lambda b, c: c.update(token_ids=[2**40])),
    "calls-text": good_with(lambda b, c: c["message"].update(tool_calls=["Bash", 3])),
    "finish-object": good_with(lambda b, c: c.update(finish_reason={"why": "stop"})),
    "usage-words": good_with(lambda b, c: b["usage"].update(prompt_tokens="many")),
}
DEGRADED = {
    "no-ids": (good_with(lambda b, c: c.pop("token_ids")), "upstream sent no completion token_ids"),
    "no-prompt": (good_with(lambda b, c: b.pop("prompt_token_ids")), "upstream sent no prompt_token_ids"),
    "short-logprobs": (good_with(lambda b, c: c["logprobs"]["content"].pop()),
                       "upstream sent 49 logprobs for 50 sampled tokens"),
}


@pytest.fixture(scope="module")
def stub():
    with live.StubUpstream() as upstream:
        for sid, body in UNUSABLE.items():
            upstream.plans[sid] = answer(body)
        for sid, (body, _) in DEGRADED.items():
            upstream.plans[sid] = upstream.plans[f"build-{sid}"] = upstream.plans[f"rates-{sid}"] = answer(body)
        upstream.plans["ids-huge-anthropic"] = answer(UNUSABLE["ids-huge"])
        upstream.plans["no-choices"] = answer({**GOOD, "choices": []})
        upstream.plans["sse"] = answer(None, raw=live.fixture_body("chat_stream_tools"),
                                       headers={"content-type": "text/event-stream"})
        upstream.plans["html"] = answer(None, raw=b"<html>bad gateway</html>", headers={"content-type": "text/html"})
        upstream.plans["busy"] = answer({"error": {"message": "slow down", "code": 429}}, 429, {"retry-after": "7"})
        surrogate = good_with(lambda b, c: c["message"].update(content="odd \ud800 text"))
        upstream.plans["odd-answer"] = answer(surrogate)
        yield upstream


@pytest.fixture(scope="module")
def gw(stub, tmp_path_factory, tracetap_home):
    store = tmp_path_factory.mktemp("answers") / "store"
    with live.start_gateway(store, "--upstream", stub.url) as process:
        yield process


def client(gw, session: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/s/{session}/v1", api_key="sk-test", max_retries=0)


def row_of(gw, session: str) -> dict:
    [row] = live.store_rows(gw.store, "session_id = ?", [session])
    return row


@pytest.mark.parametrize("session", sorted(UNUSABLE))
def test_unusable_answer_is_a_502_and_an_upstream_error_row(gw, session):
    with pytest.raises(openai.APIStatusError) as error:
        client(gw, session).chat.completions.create(**CALL)
    assert error.value.status_code == 502
    assert error.value.body["type"] == "api_error" and "unusable" in error.value.body["message"]
    row = row_of(gw, session)
    assert (row["status"], row["http_status"]) == ("upstream_error", 502)
    assert "unusable" in row["error"] and row["completion_token_ids"] is None
    assert json.loads(row["chat_response_json"]) == UNUSABLE[session]  # the upstream's body, kept whole
    assert json.loads(row["response_json"])["error"]["message"] == error.value.body["message"]


def test_unusable_answer_in_the_anthropic_shape(gw):
    messages = anthropic.Anthropic(base_url=f"{gw.url}/s/ids-huge-anthropic", api_key="k", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as error:
        messages.messages.create(model="claude-x", max_tokens=20, messages=[{"role": "user", "content": "hi"}])
    assert error.value.status_code == 502 and error.value.body["type"] == "error"


def test_a_body_that_is_not_json_is_kept_as_text(gw):
    with pytest.raises(openai.APIStatusError) as error:
        client(gw, "html").chat.completions.create(**CALL)
    assert error.value.status_code == 502
    row = row_of(gw, "html")
    assert row["status"] == "upstream_error"
    assert json.loads(row["chat_response_json"]) == "<html>bad gateway</html>"


@pytest.mark.parametrize("session", sorted(DEGRADED))
def test_answer_without_training_data_is_served_and_recorded_degraded(gw, session):
    body, reason = DEGRADED[session]
    reply = client(gw, session).chat.completions.create(**CALL)
    assert reply.choices[0].message.tool_calls[0].function.name == "Bash"
    row = row_of(gw, session)
    assert (row["status"], row["http_status"], row["error"]) == ("degraded", 200, reason)
    assert row["completion_token_ids"] == body["choices"][0].get("token_ids")
    ids = row["completion_token_ids"]
    assert row["logprobs"] is None if session != "no-prompt" else len(row["logprobs"]) == len(ids)


def test_a_stream_to_a_non_streaming_call_is_degraded(gw):
    reply = client(gw, "sse").chat.completions.create(**CALL)
    assert reply.choices[0].message.tool_calls[0].function.name == "Bash"
    row = row_of(gw, "sse")
    assert row["status"] == "degraded" and row["error"].startswith("upstream answered a non-streaming call")


def test_no_choices_is_a_502_recorded_degraded(gw):
    with pytest.raises(openai.APIStatusError) as error:
        client(gw, "no-choices").chat.completions.create(**CALL)
    assert error.value.status_code == 502
    row = row_of(gw, "no-choices")
    assert (row["status"], row["http_status"], row["error"]) == ("degraded", 502, "upstream sent no choices")


def test_builders_leave_degraded_calls_out_and_count_them(gw):
    sessions = [f"build-{sid}" for sid in DEGRADED] + ["build-ok"]
    for session in sessions:
        client(gw, session).chat.completions.create(**CALL)
    summary = build(gw.store, "per_request", sessions)
    assert summary.degraded == len(DEGRADED) and summary.traces == 1
    with connect(gw.store) as con:
        traced = con.sql("SELECT DISTINCT session_id FROM trajectories").fetchall()
    assert traced == [("build-ok",)]


def test_error_rates_show_degraded_calls(gw):
    for session, (_, reason) in DEGRADED.items():
        client(gw, f"rates-{session}").chat.completions.create(**CALL)
        with connect(gw.store) as con:
            rows = run_query(con, "error_rates", {"session_id": f"rates-{session}"}).fetchall()
        assert rows == [("degraded", 200, 1, 1, 1.0, reason)]


@pytest.mark.parametrize(("session", "body"), [
    ("user-escaped", b'{"model":"m","messages":[{"role":"user","content":"hi"}],"user":"a\\ud800b"}'),
    ("user-raw", b'{"model":"m","messages":[{"role":"user","content":"hi"}],"user":"a\xed\xa0\x80b"}'),
])
def test_lone_surrogates_in_a_request_are_stored_escaped(gw, session, body):
    reply = httpx.post(f"{gw.url}/s/{session}/v1/chat/completions", content=body,
                       headers={"content-type": "application/json"}, timeout=30)
    assert reply.status_code == 200
    row = row_of(gw, session)
    assert row["status"] == "ok" and "a\\ud800b" in row["request_json"]
    assert json.loads(row["request_json"])["user"] == "a\ud800b"  # reads back to what was sent


def test_lone_surrogate_in_anthropic_metadata(gw):
    body = (b'{"model":"claude-x","max_tokens":20,"messages":[{"role":"user","content":"hi"}],'
            b'"metadata":{"user_id":"u-\xed\xa0\x80"}}')
    reply = httpx.post(f"{gw.url}/s/meta-odd/v1/messages", content=body,
                       headers={"content-type": "application/json", "anthropic-version": "2023-06-01"}, timeout=30)
    assert reply.status_code == 200 and reply.json()["type"] == "message"
    assert json.loads(row_of(gw, "meta-odd")["request_json"])["metadata"]["user_id"] == "u-\ud800"


def test_lone_surrogate_in_an_answer_reaches_the_caller_and_the_store(gw):
    reply = client(gw, "odd-answer").chat.completions.create(**CALL)
    assert reply.choices[0].message.content == "odd \ud800 text"
    row = row_of(gw, "odd-answer")
    assert row["status"] == "ok"
    assert json.loads(row["chat_response_json"])["choices"][0]["message"]["content"] == "odd \ud800 text"


def test_429_keeps_retry_after(gw):
    with pytest.raises(openai.RateLimitError) as error:
        client(gw, "busy").chat.completions.create(**CALL)
    assert error.value.response.headers["retry-after"] == "7"
    assert error.value.body["message"] == "slow down"
    row = row_of(gw, "busy")
    assert (row["status"], row["http_status"]) == ("upstream_error", 429)
