"""Completion rows: secrets never reach them, token columns only for ok calls, and they store as-is."""

from __future__ import annotations

import json

import pytest
from live import fixture_body, fixture_request
from tracetap.capture.record import Call, build_row, display_path, harness_hint
from tracetap.capture.redact import MASK, redact
from tracetap.capture.upstream import parse_chat_response, with_token_flags
from tracetap.store import TABLES, StoreWriter, connect


@pytest.mark.parametrize(("path", "query", "expected"), [
    ("/v1/messages", {"beta": "true"}, "/v1/messages?beta=true"),
    ("/v1beta/models/g:streamGenerateContent", {"alt": "sse", "key": "AIza-secret"},
     "/v1beta/models/g:streamGenerateContent?alt=sse&key=[redacted]"),
    ("/v1/chat/completions", {"token": "t-1", "sig": "s-2", "auth": "a-3", "X-Access-Token": "x-4"},
     "/v1/chat/completions?token=[redacted]&sig=[redacted]&auth=[redacted]&X-Access-Token=[redacted]"),
    ("/v1/chat/completions", {}, "/v1/chat/completions"),
])
def test_stored_path_masks_query_credentials(path, query, expected):
    assert build_row(ok_call(path=display_path(path, query)))["path"] == expected


@pytest.mark.parametrize(("agent", "harness"), [
    ("claude-cli/2.0.1 (external, cli)", "claude_code"), ("OpenAI/Python 3.57.0", "openai_python"),
    ("GeminiCLI/0.56.0 (linux; x64)", "gemini_cli"), ("codex_exec/0.50", "codex"), ("curl/8", None),
    ("QwenCode/0.24.4 (linux; x64)", "qwen_code"), ("QwenCode/0.24.4 (linux; x64) OpenAI/JS 5.12.2", "qwen_code"),
    ("OpenAI/JS 5.12.2", "pi"), ("opencode/1.0.3 OpenAI/JS 5.12.2", "opencode"),
    ("OpenAI/JS 5.12.2 my-own-agent/1", None), (None, None),
])
def test_harness_hint(agent, harness):
    assert harness_hint(agent) == harness


def ok_call(name: str = "chat_tools_auto_call", **fields) -> Call:
    request = {**fixture_request(name), "api_key": "sk-secret"}
    upstream = json.loads(fixture_body(name))
    call = Call(session_id="run-1", api="openai_chat", path="/v1/chat/completions", stream=False,
                requested_model="gpt-4o", request_body=request, completion_id="cmpl-abc",
                user_agent="OpenAI/Python 3.57.0", session_source="header", served_model="tiny",
                chat_request=redact(with_token_flags({**request, "model": "tiny"})),  # as the service sends it
                capture=parse_chat_response(upstream), response_body={"id": "cmpl-abc"}, upstream_ms=12.5)
    for key, value in fields.items():
        setattr(call, key, value)
    return call


def test_ok_row():
    call = ok_call()
    row = build_row(call)
    assert set(row) == set(TABLES["completions"].names)
    assert row["prompt_token_ids"] == call.capture.prompt_token_ids
    assert len(row["logprobs"]) == len(row["completion_token_ids"]) == row["completion_tokens"]
    assert row["tool_calls"] == call.capture.tool_calls and row["finish_reason"] == "tool_calls"
    assert "sk-secret" not in json.dumps(row, default=str)
    assert json.loads(row["request_json"])["api_key"] == MASK
    assert json.loads(row["chat_request_json"])["return_token_ids"] is True
    assert "token_ids" not in row["chat_response_json"]
    assert json.loads(row["metadata_json"]) == {
        "capture_mode": "live", "session_source": "header", "user_agent": "OpenAI/Python 3.57.0",
        "harness": "openai_python"}
    assert row["gateway_ms"] >= 0 and row["seq"] is None and row["finished_at"] is None


def test_failed_row_has_no_tokens():
    error = json.loads(fixture_body("error_context_overflow"))
    row = build_row(ok_call(status="upstream_error", http_status=400, error="too long", upstream_body=error,
                            response_body={"error": {"message": "too long"}}))
    assert row["status"] == "upstream_error" and row["http_status"] == 400
    assert all(row[c] is None for c in ("prompt_token_ids", "completion_token_ids", "logprobs", "tool_calls"))
    assert json.loads(row["chat_response_json"]) == error


def test_rows_store_and_read_back(tmp_path):
    with StoreWriter(tmp_path) as writer:
        writer.record_completion(build_row(ok_call("chat_top2")))
        writer.record_completion(build_row(ok_call("chat_basic", status="timeout", http_status=504)))
    db = connect(tmp_path)
    rows = db.sql("SELECT seq, status, len(logprobs), len(completion_token_ids), len(top_logprobs[1]), "
                  "top_logprobs[1][1].token, tool_calls FROM completions ORDER BY seq").fetchall()
    top2 = parse_chat_response(json.loads(fixture_body("chat_top2")))
    n = len(top2.completion_token_ids)
    assert rows == [(0, "ok", n, n, 2, top2.top_logprobs[0][0]["token"], []),
                    (1, "timeout", None, None, None, None, None)]


def test_text_without_utf8_form_is_stored_escaped_never_dropped(tmp_path):
    call = ok_call(request_body={"model": "m", "user": "a\ud800b"}, requested_model="m\udfff",
                   error="bad \ud800", status="degraded", upstream_ms=1.0)
    call.capture.tool_calls = [{"id": "t", "name": "Bash", "arguments": '{"cmd": "\udc80"}'}]
    with StoreWriter(tmp_path) as writer:
        writer.record_completion(build_row(call))
    [(request, model, error, calls)] = connect(tmp_path).sql(
        "SELECT request_json, requested_model, error, tool_calls FROM completions").fetchall()
    assert json.loads(request)["user"] == "a\ud800b"  # the JSON escape reads back to the same string
    assert (model, error, calls[0]["arguments"]) == ("m\\udfff", "bad \\ud800", '{"cmd": "\\udc80"}')
