"""Gemini through the real gateway: a `tracetap gateway` process with the embedded engine in scripted
mode, driven by the official `google-genai` SDK; every check reads the Parquet store it wrote.
"""

from __future__ import annotations

import json
import re

import httpx
import live
import pytest
from google import genai
from google.genai import errors, types

BASH_ARGS = {"command": "ls"}
SCRIPT = [  # what the engine answers, per session, in order
    {"content": "Let me look.", "tool_calls": [{"function": {"name": "Bash", "arguments": BASH_ARGS}}]},
    {"content": "There are two files.", "reasoning": "The listing answered it."},
]
BASH = types.FunctionDeclaration(
    name="Bash", description="Run a shell command.",
    parameters=types.Schema(type="OBJECT", properties={"command": types.Schema(type="STRING")},
                            required=["command"]),
)
CONFIG = types.GenerateContentConfig(
    system_instruction="You are terse.", max_output_tokens=64,
    tools=[types.Tool(function_declarations=[BASH])],
    thinking_config=types.ThinkingConfig(include_thoughts=True),
)
QUESTION = types.Content(role="user", parts=[types.Part(text="What is here?")])
FRAME = re.compile(rb"data: [^\r\n]+\n\n")
MODEL = "gemini-2.5-flash"
GENERATE = f"/v1beta/models/{MODEL}:generateContent"


@pytest.fixture(scope="module")
def gw(tmp_path_factory, tracetap_home):
    with live.scripted_gateway(tmp_path_factory.mktemp("gemini-e2e"), SCRIPT) as process:
        yield process


def client(gw, session: str) -> genai.Client:
    """The SDK sends the key as `x-goog-api-key`; an `sk-tap-` key is the session id."""
    return genai.Client(api_key=f"sk-tap-{session}", http_options=types.HttpOptions(base_url=gw.url))


def rows(gw, session: str) -> list[dict]:
    return live.store_rows(gw.store, "session_id = ?", [f"sk-tap-{session}"])


def assert_aligned(row: dict) -> None:
    assert row["status"] == "ok" and row["api"] == "gemini"
    assert len(row["logprobs"]) == len(row["completion_token_ids"]) == row["completion_tokens"] > 0
    assert len(row["prompt_token_ids"]) == row["prompt_tokens"] > 0
    assert (row["requested_model"], row["served_model"]) == (MODEL, "tracetap-tiny")


def test_function_call_round_trip_is_recorded_turn_by_turn(gw):
    gemini = client(gw, "gem-round-trip")
    first = gemini.models.generate_content(model=MODEL, contents=[QUESTION], config=CONFIG)
    (call,) = first.function_calls
    assert (call.name, call.args) == ("Bash", BASH_ARGS) and call.id
    assert first.candidates[0].content.parts[0].text == "Let me look."
    assert first.candidates[0].finish_reason == types.FinishReason.STOP
    answer = types.Part(function_response=types.FunctionResponse(
        id=call.id, name=call.name, response={"output": "a.py\nb.py"}))
    history = [QUESTION, first.candidates[0].content, types.Content(role="user", parts=[answer])]
    chunks = list(gemini.models.generate_content_stream(model=MODEL, contents=history, config=CONFIG))
    assert "".join(chunk.text or "" for chunk in chunks) == "There are two files."
    thoughts = [p.text for c in chunks for p in c.candidates[0].content.parts if p.thought]
    assert thoughts == ["The listing answered it."]
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert chunks[-1].usage_metadata.prompt_token_count > first.usage_metadata.prompt_token_count

    one, two = rows(gw, "gem-round-trip")
    for row in (one, two):
        assert_aligned(row)
    assert [one["stream"], two["stream"]] == [False, True]
    assert one["path"].endswith(f"/models/{MODEL}:generateContent")  # the SDK picks the API version
    assert two["path"].endswith(f"/models/{MODEL}:streamGenerateContent?alt=sse")
    assert one["finish_reason"] == "tool_calls" and [t["name"] for t in one["tool_calls"]] == ["Bash"]
    assert one["prompt_tokens"] == first.usage_metadata.prompt_token_count
    # the second prompt is the first prompt, then the sampled turn token for token, then the tool result
    turn = one["prompt_token_ids"] + one["completion_token_ids"]
    assert two["prompt_token_ids"][: len(turn)] == turn
    stored = json.loads(two["response_json"])["candidates"][0]
    assert stored["finishReason"] == "STOP"
    assert stored["content"]["parts"][-1] == {"text": "There are two files."}
    sent = json.loads(two["chat_request_json"])["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[3] == {"role": "tool", "tool_call_id": call.id, "content": "a.py\nb.py"}
    assert "sk-tap" not in two["request_json"] and json.loads(two["request_json"])["contents"][2]["parts"]


def test_stream_framing_through_the_gateway(gw):
    bash = {"name": "Bash", "parameters": {"type": "OBJECT", "properties": {"command": {"type": "STRING"}}}}
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "tools": [{"functionDeclarations": [bash]}]}
    response = httpx.post(f"{gw.url}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse",
                          json=body, headers={"x-goog-api-key": "sk-tap-gem-frames"}, timeout=60)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    frames = FRAME.findall(response.content)
    assert b"".join(frames) == response.content  # `data: <json>` frames and nothing else
    last = json.loads(frames[-1][len(b"data: "):])
    assert last["candidates"][0]["finishReason"] == "STOP" and last["usageMetadata"]["totalTokenCount"] > 0
    assert last["candidates"][0]["content"]["parts"][-1]["functionCall"]["args"] == BASH_ARGS
    [row] = rows(gw, "gem-frames")
    assert_aligned(row)
    assert row["stream"] is True and row["path"].endswith(":streamGenerateContent?alt=sse")


def test_count_tokens_matches_the_recorded_prompt(gw):
    gemini = client(gw, "gem-count")
    counted = gemini.models.count_tokens(model=MODEL, contents="How many tokens is this?")
    assert rows(gw, "gem-count") == []  # counting is not a model call
    gemini.models.generate_content(model=MODEL, contents="How many tokens is this?")
    [row] = rows(gw, "gem-count")
    assert_aligned(row)
    assert counted.total_tokens == row["prompt_tokens"]


def test_models_list(gw):
    gemini = client(gw, "gem-models")
    assert [m.name for m in gemini.models.list()] == ["models/tracetap-tiny"]


@pytest.fixture(scope="module")
def earlier_data(gw):
    """Something already stored that bad input must leave untouched."""
    gemini = client(gw, "gem-before-bad")  # keep the client: collecting it closes its connection pool
    gemini.models.generate_content(model=MODEL, contents="hi")


def part(**fields) -> bytes:
    return json.dumps({"contents": [{"role": "user", "parts": [fields]}]}).encode()


@pytest.mark.parametrize("path, body, status, fragment", [
    (GENERATE, b'{"contents": [', 400, "not valid JSON"),
    (GENERATE, b'[{"contents": []}]', 400, "JSON object"),
    (GENERATE, b'{"generationConfig": {}}', 400, "contents is required"),
    (GENERATE, b'{"contents": "hi"}', 400, "contents: expected an array, got string"),
    (GENERATE, part(executableCode={"code": "1"}), 400, "unsupported part"),
    (GENERATE, part(functionCall={"name": "Bash", "args": {}}), 400, "not allowed in a user turn"),
    (GENERATE, part(text=7), 400, "contents.0.parts.0.text: expected a string, got number"),
    (GENERATE, b'{"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"maxOutputTokens": "9"}}',
     400, "maxOutputTokens"),
    (GENERATE.replace("generateContent", "streamGenerateContent") + "?alt=sse", b'{"contents": []}', 400,
     "contents is required"),
    (f"/v1beta/models/{MODEL}:embedContent", part(text="x"), 404, "unknown endpoint"),
], ids=["malformed-json", "not-an-object", "missing-contents", "contents-type", "unknown-part",
        "call-in-user-turn", "text-type", "config-type", "stream", "unknown-verb"])
def test_bad_input_is_a_gemini_error_and_writes_nothing(gw, earlier_data, path, body, status, fragment):
    before = live.settled_snapshot(gw.store)
    response = httpx.post(gw.url + path, content=body, timeout=60,
                          headers={"x-goog-api-key": "sk-tap-gem-bad", "content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"code", "message", "status"} and error["code"] == status
    assert error["status"] == {400: "INVALID_ARGUMENT", 404: "NOT_FOUND"}[status]
    assert fragment in error["message"]
    assert live.settled_snapshot(gw.store) == before and len(rows(gw, "gem-before-bad")) == 1


def test_bad_input_is_the_sdk_error_class(gw):
    bad = types.Part(executable_code=types.ExecutableCode(code="print(1)", language="PYTHON"))
    gemini = client(gw, "gem-bad-sdk")
    with pytest.raises(errors.ClientError) as error:
        gemini.models.generate_content(model=MODEL, contents=types.Content(role="user", parts=[bad]))
    assert (error.value.code, error.value.status) == (400, "INVALID_ARGUMENT")
    assert rows(gw, "gem-bad-sdk") == []
