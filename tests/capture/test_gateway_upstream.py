"""A real gateway process in front of upstreams that misbehave: a stub replaying the real vLLM fixtures
(errors included), a slow one (504) and a closed port (502). Every call's record is checked on disk.
"""

from __future__ import annotations

import hashlib
import json
import time

import anthropic
import httpx
import live
import openai
import pytest

CALL = {"model": "gpt-4o", "messages": [{"role": "user", "content": "List the files."}], "max_tokens": 20}


@pytest.fixture(scope="module")
def stub():
    with live.StubUpstream() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def gw(stub, tmp_path_factory, tracetap_home):
    store = tmp_path_factory.mktemp("upstream") / "store"
    with live.start_gateway(store, "--upstream", stub.url, "--timeout", "1.5") as process:
        yield process


def post(gw, session: str, body: dict = CALL) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers={"x-tracetap-session": session},
                      timeout=30)


def stored(store, session: str) -> list[dict]:
    return live.store_rows(store, "session_id = ?", [session])


@pytest.mark.parametrize("name", live.CHAT_FIXTURES)
def test_fixture_answers_are_recorded_like_the_parser_reads_them(gw, stub, name):
    response = post(gw, name)
    assert response.status_code == 200
    expected = live.fixture_capture(name)
    [row] = stored(gw.store, name)
    # a stream where JSON was asked for, or an answer without ids, is served but is no training data
    streamed = live.fixture_body(name).startswith(b"data:")
    assert row["status"] == ("degraded" if streamed or expected.problems else "ok") and row["http_status"] == 200
    assert row["prompt_token_ids"] == expected.prompt_token_ids
    assert row["completion_token_ids"] == expected.completion_token_ids
    assert row["finish_reason"] == expected.finish_reason
    assert row["tool_calls"] == expected.tool_calls
    if expected.logprobs is None:
        assert row["logprobs"] is None
    else:
        assert row["logprobs"] == pytest.approx(expected.logprobs, abs=1e-5)
        assert len(row["logprobs"]) == len(row["completion_token_ids"])
    body = response.json()
    assert body["model"] == "gpt-4o" and body["id"] == row["completion_id"]
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]


def test_what_goes_upstream(gw, stub):
    post(gw, "sent-check", {**CALL, "stream": True, "stream_options": {"include_usage": True},
                            "max_completion_tokens": 7, "store": True})
    headers, sent = next((h, b) for h, b in stub.requests if h.get("x-tracetap-session") == "sent-check")
    assert sent["model"] == "tiny"  # unknown names map to the served model
    flags = (sent["stream"], sent["logprobs"], sent["top_logprobs"], sent["return_token_ids"])
    assert flags == (True, True, 0, True)  # streamed upstream: a vLLM upstream streams token ids
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert "store" not in sent and sent["max_tokens"] == 20
    assert "authorization" not in {k.lower() for k in headers}


@pytest.mark.parametrize("name", live.ERROR_FIXTURES)
def test_upstream_errors_keep_their_status_and_are_recorded(gw, name):
    upstream_body = json.loads(live.fixture_body(name))
    response = post(gw, name)
    assert response.status_code == live.INDEX[name]["status"]
    error = response.json()["error"]
    assert error["message"] == upstream_body["error"]["message"]
    assert set(error) == {"message", "type", "param", "code"}
    [row] = stored(gw.store, name)
    assert (row["status"], row["http_status"]) == ("upstream_error", live.INDEX[name]["status"])
    assert row["prompt_token_ids"] is None and row["completion_token_ids"] is None and row["logprobs"] is None
    assert json.loads(row["chat_response_json"]) == upstream_body
    assert json.loads(row["chat_request_json"])["return_token_ids"] is True


def test_upstream_400_is_the_sdk_error_class(gw):
    chat = openai.OpenAI(base_url=f"{gw.url}/s/error_context_overflow/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        chat.chat.completions.create(model="m", messages=CALL["messages"], stream=True)


def test_slow_upstream_times_out(gw, stub):
    stub.plans["slow"] = live.Plan(delay=4.0)
    response = post(gw, "slow")
    assert response.status_code == 504 and response.json()["error"]["type"] == "timeout_error"
    [row] = stored(gw.store, "slow")
    assert (row["status"], row["http_status"]) == ("timeout", 504) and row["completion_token_ids"] is None


def test_closed_port_is_unreachable(tmp_path):
    port = live.free_port()
    store = tmp_path / "store"
    with live.start_gateway(store, "--upstream", f"http://127.0.0.1:{port}", "--served-model", "tiny") as gw:
        response = post(gw, "down")
        models = httpx.get(f"{gw.url}/v1/models").json()
    assert response.status_code == 502 and "unreachable" in response.json()["error"]["message"]
    assert [m["id"] for m in models["data"]] == ["tiny"]
    [row] = stored(store, "down")
    assert (row["status"], row["http_status"], row["served_model"]) == ("upstream_error", 502, "tiny")


def test_models_and_probes_in_each_api_shape(gw):
    assert [m.id for m in anthropic.Anthropic(base_url=gw.url, api_key="x").models.list()] == ["tiny"]
    gemini = httpx.get(f"{gw.url}/v1beta/models", headers={"x-goog-api-key": "k"}).json()
    assert [m["name"] for m in gemini["models"]] == ["models/tiny"]
    assert httpx.get(f"{gw.url}/v1beta/models/gemini-2.5-flash").json()["name"] == "models/gemini-2.5-flash"
    probe = httpx.head(f"{gw.url}/", headers={"anthropic-version": "2023-06-01"})
    assert probe.status_code == 200 and probe.content == b""


def test_count_tokens_asks_the_upstream(gw):
    count = json.loads(live.fixture_body("tokenize_chat"))["count"]
    messages = anthropic.Anthropic(base_url=gw.url, api_key="x").messages
    counted = messages.count_tokens(model="claude-x", messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens == count
    assert stored(gw.store, "key-" + hashlib.sha256(b"x").hexdigest()[:16]) == []  # counting records nothing


def test_close_unknown_session_is_404(gw):
    response = httpx.post(f"{gw.url}/sessions/never-seen/close", headers=live.control_headers())
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_idle_sessions_get_compacted(stub, tmp_path):
    store = tmp_path / "store"
    with live.start_gateway(store, "--upstream", stub.url, "--idle-compact", "1") as gw:
        assert post(gw, "idle-run").status_code == post(gw, "idle-run").status_code == 200
        deadline = time.monotonic() + 15
        while (live.committed_seqs(store, "idle-run"), live.logged_seqs(store, "idle-run")) != ([0, 1], []):
            assert time.monotonic() < deadline, (live.committed_seqs(store, "idle-run"),
                                                 live.logged_seqs(store, "idle-run"))
            time.sleep(0.2)
    assert [r["seq"] for r in stored(store, "idle-run")] == [0, 1]


def test_gateway_in_front_of_a_separate_engine_process(engine, gateway, tmp_path):
    script = live.write_script(tmp_path / "script.jsonl", [{"content": "Hi from the script."}])
    gw = gateway("--upstream", engine(script).url)
    chat = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-tap-engine", max_retries=0)
    answer = chat.chat.completions.create(model="any", messages=CALL["messages"])
    assert answer.choices[0].message.content == "Hi from the script." and answer.model == "any"
    [row] = stored(gw.store, "sk-tap-engine")
    assert row["served_model"] == "tracetap-tiny" and row["completion_token_ids"][-1] == 151645  # <|im_end|>
    assert len(row["logprobs"]) == len(row["completion_token_ids"])
