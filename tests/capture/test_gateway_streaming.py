"""True streaming through a real gateway over the embedded engine, paced so a generation takes seconds.

For each of the four APIs: the first content event reaches the official SDK while the engine is still
generating; the events equal the synthetic stream of the same completion (consecutive deltas joined); the
stored row has the prompt and sampled ids and logprobs of a whole call of the same script; a client that
leaves mid-stream leaves a `disconnected` row with its partial tokens; a pause with abort mid-stream
leaves an `aborted` row with its partial tokens and an in-stream error; a gateway killed with SIGKILL
before the terminal event leaves the client without one and the store without an `ok` row. The tests on the
shared gateway run in both tokenization modes; in `gateway` mode a streamed multi-turn tool session also merges
into one chain with zero drift.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import anthropic
import httpx
import live
import openai
import pytest
from google import genai
from google.genai import types
from sse_events import events, joined
from tracetap.builders import build
from tracetap.capture.adapters import ADAPTERS
from tracetap.capture.adapters.base import RequestContext

from tracetap.common import decode

PACE_MS = 50
TEXT = "The quick brown fox jumps over the lazy dog, then it runs far away into the green forest to rest."
BASH = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
SCRIPT = [{"content": TEXT, "when": {"has_tools": False}},
          {"content": "Listing.", "reasoning": "Let me look first.",
           "tool_calls": [{"function": {"name": "Bash", "arguments": {"command": "ls -la"}}}],
           "when": {"has_tools": True}}]
APIS = list(ADAPTERS)
TERMINAL = {"openai_chat": "[DONE]", "anthropic_messages": "message_stop", "openai_responses": "response.completed",
            "gemini": "finishReason"}
CONTENT = {"openai_chat": b'"delta":{"content":"', "anthropic_messages": b"text_delta",
           "openai_responses": b"output_text.delta", "gemini": b'"text":'}  # in an event carrying sampled text


@dataclass(frozen=True)
class Call:
    """One API's raw request for the scripted reply: path, body, and the body with tools."""

    path: str
    body: dict
    tools: dict

    def url(self, gw: live.GatewayProcess, session: str, stream: bool) -> str:
        path = self.path.replace(":generateContent", ":streamGenerateContent?alt=sse") if stream else self.path
        return f"{gw.url}/s/{session}{path}"

    def json(self, stream: bool, tools: bool) -> dict:
        body = {**self.body, **(self.tools if tools else {})}
        return body if "contents" in body else {**body, "stream": stream}


USER = [{"role": "user", "content": "hi"}]
CALLS = {
    "openai_chat": Call("/v1/chat/completions", {"model": "m", "messages": USER},
                        {"tools": [{"type": "function", "function": {"name": "Bash", "parameters": BASH}}]}),
    "anthropic_messages": Call("/v1/messages", {"model": "m", "max_tokens": 200, "messages": USER},
                               {"tools": [{"name": "Bash", "input_schema": BASH}]}),
    "openai_responses": Call("/v1/responses", {"model": "m", "input": "hi"},
                             {"tools": [{"type": "function", "name": "Bash", "parameters": BASH}]}),
    "gemini": Call("/v1beta/models/m:generateContent", {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
                   {"tools": [{"functionDeclarations": [{"name": "Bash", "parameters": BASH}]}]}),
}


def paced_gateway(root, *args: str) -> live.GatewayProcess:
    script = live.write_script(root / "script.jsonl", SCRIPT)
    return live.start_gateway(root / "store", "--script", str(script), *args,
                              env={"TRACETAP_ENGINE_PACE_MS": str(PACE_MS)})


MODES = {"upstream": (), "gateway": ("--tokenize", "gateway")}  # who renders and parses: the engine or the gateway


@pytest.fixture(scope="module", params=list(MODES))
def gw(request, tmp_path_factory) -> Iterator[live.GatewayProcess]:
    """A paced gateway in each tokenization mode: every test on it holds in both."""
    with paced_gateway(tmp_path_factory.mktemp(f"streaming-{request.param}"), *MODES[request.param]) as process:
        yield process


def rows(gw: live.GatewayProcess, session: str) -> list[dict]:
    return live.store_rows(gw.store, "session_id = ?", [session])


def read_events(gw, api: str, session: str, tools: bool = False, stop_after: int | None = None):
    """(SSE frames received, the response headers) of one raw streamed call; `stop_after` frames, then hang up."""
    call, frames, lines = CALLS[api], [], []
    with httpx.Client(timeout=60) as client, client.stream(
            "POST", call.url(gw, session, True), json=call.json(True, tools)) as response:
        for line in response.iter_lines():
            if line:
                lines.append(line)
                continue
            frames.append(("\n".join(lines) + "\n\n").encode())
            lines = []
            if len(frames) == stop_after:
                break
        return frames, response.headers


# ---------------------------------------------------------------- the first event comes early (official SDKs)

def _openai_chat(base: str) -> Iterator[str]:
    stream = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0).chat.completions.create(
        model="m", messages=USER, stream=True)
    return (chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def _anthropic(base: str) -> Iterator[str]:
    client = anthropic.Anthropic(base_url=base, api_key="k", max_retries=0)
    with client.messages.stream(model="m", max_tokens=200, messages=USER) as stream:
        yield from stream.text_stream


def _responses(base: str) -> Iterator[str]:
    stream = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0).responses.create(
        model="m", input="hi", stream=True)
    return (event.delta for event in stream if event.type == "response.output_text.delta")


def _gemini(base: str) -> Iterator[str]:
    client = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=base))  # open while iterated
    for chunk in client.models.generate_content_stream(model="m", contents="hi"):
        yield chunk.text or ""


SDK_TEXT = {"openai_chat": _openai_chat, "anthropic_messages": _anthropic, "openai_responses": _responses,
            "gemini": _gemini}


@pytest.mark.parametrize("api", APIS)
def test_first_content_reaches_the_sdk_while_the_engine_generates(gw, api):
    started, first, text = time.perf_counter(), None, ""
    for piece in SDK_TEXT[api](f"{gw.url}/s/early-{api}"):
        if piece and first is None:
            first = time.perf_counter() - started
        text += piece
    total = time.perf_counter() - started
    assert text == TEXT
    assert first is not None and first < total / 2, (first, total)  # the rest took the engine's pace
    [row] = rows(gw, f"early-{api}")
    assert (row["status"], row["stream"]) == ("ok", True)


# ---------------------------------------------------------------- what is sent and stored

@pytest.mark.parametrize("tools", [False, True], ids=["text", "tool_call"])
@pytest.mark.parametrize("api", APIS)
def test_events_equal_the_synthetic_stream_and_tokens_a_whole_call(gw, api, tools):
    session = f"same-{api}-{tools}"
    frames, headers = read_events(gw, api, session, tools)
    [row] = rows(gw, session)
    ctx = RequestContext(requested_model="m", served_model=row["served_model"], stream=True,
                         completion_id=headers["x-tracetap-completion-id"], created=int(row["created_at"].timestamp()),
                         path=CALLS[api].path, extra={"request": CALLS[api].json(True, tools)})
    synthetic = ADAPTERS[api].to_sse_events(json.loads(row["chat_response_json"]), ctx)
    assert joined(events(frames)) == joined(events(synthetic))
    whole = httpx.post(CALLS[api].url(gw, f"whole-{session}", False), json=CALLS[api].json(False, tools), timeout=60)
    assert whole.status_code == 200
    [plain] = rows(gw, f"whole-{session}")
    for column in ("prompt_token_ids", "completion_token_ids", "logprobs", "finish_reason"):
        assert row[column] == plain[column], column
    assert row["status"] == "ok" and len(row["logprobs"]) == len(row["completion_token_ids"]) > 0


# ---------------------------------------------------------------- streams that end early

def partial(row: dict) -> None:
    """A row with the prompt and what was sampled before the stream ended (logprobs aligned), never ok."""
    sampled = row["completion_token_ids"]
    assert row["status"] != "ok" and row["prompt_token_ids"] and 0 < len(sampled) < 30
    assert len(row["logprobs"]) == len(sampled)


@pytest.mark.parametrize("api", APIS)
def test_a_client_that_leaves_mid_stream_leaves_a_disconnected_row(gw, api):
    frames, _ = read_events(gw, api, f"leaves-{api}", stop_after=3)
    assert len(frames) == 3
    deadline = time.monotonic() + 10
    while not rows(gw, f"leaves-{api}") and time.monotonic() < deadline:
        time.sleep(0.1)
    [row] = rows(gw, f"leaves-{api}")
    partial(row)
    assert (row["status"], row["finish_reason"]) == ("disconnected", None)


@pytest.mark.parametrize("api", APIS)
def test_a_pause_with_abort_mid_stream_leaves_an_aborted_row(gw, api):
    call, frames, session = CALLS[api], [], f"paused-{api}"
    try:
        with httpx.Client(timeout=60) as client, client.stream(
                "POST", call.url(gw, session, True), json=call.json(True, False)) as response:
            for line in response.iter_lines():
                frames.append(line)
                if CONTENT[api] in line.encode() and len(frames) < 1000:
                    httpx.post(f"{gw.url}/admin/pause", json={"in_flight": "abort"},
                               headers=live.control_headers()).raise_for_status()
                    frames.append("paused")
    finally:
        httpx.post(f"{gw.url}/admin/resume", json={}, headers=live.control_headers()).raise_for_status()
    text = "\n".join(frames)
    assert "paused" in text and "aborted by a pause" in text and TERMINAL[api] not in text.split("paused")[-1]
    [row] = rows(gw, session)
    partial(row)
    assert (row["status"], row["finish_reason"]) == ("aborted", "abort")


@pytest.mark.parametrize("api", APIS)
def test_a_gateway_killed_before_the_terminal_event_leaves_no_ok_row(tmp_path, api):
    with paced_gateway(tmp_path) as process:
        call, seen = CALLS[api], []
        with httpx.Client(timeout=30) as client, client.stream(
                "POST", call.url(process, "killed", True), json=call.json(True, False)) as response:
            try:
                for line in response.iter_lines():
                    seen.append(line)
                    if CONTENT[api] in line.encode() and process.process.poll() is None:
                        process.kill()
            except httpx.HTTPError:
                pass  # the connection died with the gateway
        assert any(CONTENT[api] in line.encode() for line in seen)
        assert not any(TERMINAL[api] in line for line in seen)
        assert all(row["status"] != "ok" for row in live.store_rows(process.store))


def test_under_on_pause_abort_a_whole_call_keeps_its_partial_tokens(tmp_path):
    """The gateway reads the upstream as a stream, so an aborted whole call still has what was sampled."""
    with paced_gateway(tmp_path, "--on-pause", "abort") as process:
        outcome: dict = {}

        def call() -> None:
            outcome["reply"] = httpx.post(CALLS["openai_chat"].url(process, "whole-aborted", False),
                                          json=CALLS["openai_chat"].json(False, False), timeout=60)

        caller = threading.Thread(target=call)
        caller.start()
        while httpx.get(f"{process.url}/admin/status", headers=live.control_headers()).json()["in_flight"] == 0:
            time.sleep(0.05)
        time.sleep(1.0)  # the engine is streaming by now, at its pace
        httpx.post(f"{process.url}/admin/pause", json={}, headers=live.control_headers()).raise_for_status()
        caller.join(30)
        assert outcome["reply"].status_code == 503 and outcome["reply"].headers["retry-after"] == "5"
        [row] = live.store_rows(process.store)
        partial(row)
        assert (row["status"], row["finish_reason"], row["http_status"]) == ("aborted", "abort", 503)


def test_streams_one_after_another_on_one_connection(gw):
    """The proxy reuses its connection to the stream server for the next stream of a kept-alive client."""
    call = CALLS["openai_chat"]
    with httpx.Client(timeout=60) as client:
        for _ in range(4):
            reply = client.post(call.url(gw, "kept-alive", True), json=call.json(True, False))
            assert reply.status_code == 200 and reply.text.endswith("data: [DONE]\n\n")
    assert [row["status"] for row in rows(gw, "kept-alive")] == ["ok"] * 4


@pytest.mark.parametrize("api", ["openai_chat", "anthropic_messages"])
def test_an_engine_that_dies_mid_stream_leaves_an_upstream_error_row(tmp_path, monkeypatch, api):
    monkeypatch.setenv("TRACETAP_ENGINE_PACE_MS", str(PACE_MS))
    engine = live.start_engine(tmp_path / "engine", live.write_script(tmp_path / "script.jsonl", SCRIPT))
    with engine, live.start_gateway(tmp_path / "store", "--upstream", engine.url) as process:
        call, seen = CALLS[api], []
        with httpx.Client(timeout=30) as client, client.stream(
                "POST", call.url(process, "engine-died", True), json=call.json(True, False)) as response:
            for line in response.iter_lines():
                seen.append(line)
                if CONTENT[api] in line.encode() and engine.process.poll() is None:
                    engine.process.kill()
        text = "\n".join(seen)
        assert "unreachable" in text and TERMINAL[api] not in text  # an in-stream error, no terminal event
        [row] = live.store_rows(process.store)
        partial(row)
        assert row["status"] == "upstream_error"


SESSION = "sk-tap-streamed-tools"  # an API key of this form is the session id


def test_a_streamed_tool_session_in_gateway_mode_merges_with_zero_drift(tmp_path):
    """Each turn streamed through the OpenAI SDK, its deltas joined by the harness, the tool result sent back:
    every later prompt continues the earlier one verbatim, so the build finds one chain and no drift."""
    ls = {"function": {"name": "Bash", "arguments": {"command": "ls"}}}
    script = [{"content": "Let me look.", "tool_calls": [ls], "tokens": "split"},
              {"content": "Two files.", "tokens": "split"}]
    with live.scripted_gateway(tmp_path, script, "--tokenize", "gateway") as process:
        sdk = openai.OpenAI(base_url=f"{process.url}/v1", api_key=SESSION, max_retries=0)
        tools = [{"type": "function", "function": {"name": "Bash", "parameters": BASH}}]
        messages: list = [{"role": "user", "content": "What is here?"}]
        first = streamed_message(sdk, messages, tools)
        messages += [first, {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "a.py"}]
        assert streamed_message(sdk, messages, tools)["content"] == "Two files."
        stored = live.store_rows(process.store)
        stats = build(process.store, "prefix_merging", [SESSION], decode=decode).session_stats[SESSION]
    assert [(row["status"], row["stream"]) for row in stored] == [("ok", True)] * 2
    assert [json.loads(row["metadata_json"]).get("continues") for row in stored] == [None, stored[0]["completion_id"]]
    head = list(stored[0]["prompt_token_ids"]) + list(stored[0]["completion_token_ids"])
    assert list(stored[1]["prompt_token_ids"][: len(head)]) == head  # the sampled pieces kept verbatim
    assert 151657 not in stored[0]["completion_token_ids"]  # `<tool_call>` was sampled as text pieces
    assert (stats["chains"], stats["segments"], stats["drift_tokens"], stats["break_reasons"]) == (1, 1, 0, {})


def streamed_message(sdk: openai.OpenAI, messages: list, tools: list) -> dict:
    """The assistant message a harness assembles from a streamed answer's deltas."""
    content, calls = "", {}
    for chunk in sdk.chat.completions.create(model="m", messages=messages, tools=tools, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        content += (delta.content or "") if delta else ""
        for call in (delta.tool_calls or []) if delta else []:
            empty = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            slot = calls.setdefault(call.index, empty)
            slot["id"] += call.id or ""
            slot["function"]["name"] += call.function.name or ""
            slot["function"]["arguments"] += call.function.arguments or ""
    message = {"role": "assistant", "content": content}
    return message | ({"tool_calls": [calls[i] for i in sorted(calls)]} if calls else {})
