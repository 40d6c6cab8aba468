"""OpenAI Responses end to end: the official `openai` SDK against a real `tracetap gateway` process with
the embedded engine in scripted mode, the way Codex talks to it (full history every turn, store off,
reasoning replayed as encrypted_content); every check reads the Parquet store the gateway wrote.
"""

from __future__ import annotations

import json

import httpx
import live
import openai
import pytest

MODEL = "gpt-5-codex"
ARGV = {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        "required": ["command"]}
SHELL_FUNCTION = {"type": "function", "name": "shell", "description": "Run a command.", "parameters": ARGV,
                  "strict": False}
LS = {"function": {"name": "shell", "arguments": {"command": ["ls"]}}}
SCRIPT = [  # every session plays these in order
    {"content": None, "reasoning": "I should list the files.", "tool_calls": [LS]},
    {"content": "There are two files.", "reasoning": "The listing answered it."},
    {"content": "Nothing else."},
]
INSTRUCTIONS = "You are terse."
QUESTION = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is here?"}]}


@pytest.fixture(scope="module")
def gw(tmp_path_factory, tracetap_home):
    with live.scripted_gateway(tmp_path_factory.mktemp("responses-e2e"), SCRIPT) as process:
        yield process


def client(gw, session: str) -> openai.OpenAI:
    """The SDK as Codex is configured: base URL with /v1, the bearer key names the session."""
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-{session}", max_retries=0)


def rows(gw, session: str) -> list[dict]:
    return live.store_rows(gw.store, "session_id = ?", [f"sk-tap-{session}"])


def replay(response) -> list[dict]:
    """Output items as Codex sends them back on the next turn."""
    return [item.model_dump(exclude_none=True) for item in response.output]


def run_agent(sdk: openai.OpenAI, tools: list[dict]) -> list:
    """Three turns: a tool call, its output answered over a stream, then a follow-up question."""
    common = {"model": MODEL, "instructions": INSTRUCTIONS, "tools": tools, "store": False,
              "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "medium"}}
    history = [QUESTION]
    first = sdk.responses.create(input=history, **common)
    call = first.output[-1]
    done = {"type": f"{call.type}_output", "output": "a.py\nb.py"}
    done["id" if call.type == "local_shell_call" else "call_id"] = call.call_id  # local shell says `id`
    history += [*replay(first), done]
    with sdk.responses.stream(input=history, **common) as stream:
        second = stream.get_final_response()
    history += [*replay(second), {"role": "user", "content": "Anything else?"}]
    third = sdk.responses.create(input=history, **common)
    return [first, second, third]


def check_recorded(recorded: list[dict], responses: list) -> None:
    """Aligned tokens and logprobs per call, and each prompt extending the previous turn exactly."""
    assert [(r["seq"], r["stream"]) for r in recorded] == [(0, False), (1, True), (2, False)]
    assert {(r["api"], r["status"], r["requested_model"]) for r in recorded} == {
        ("openai_responses", "ok", MODEL)}
    assert [r["finish_reason"] for r in recorded] == ["tool_calls", "stop", "stop"]
    for row, response in zip(recorded, responses, strict=True):
        assert json.loads(row["response_json"])["id"] == response.id
        assert response.usage.input_tokens == row["prompt_tokens"] == len(row["prompt_token_ids"])
        assert response.usage.output_tokens == row["completion_tokens"]
        assert len(row["logprobs"]) == len(row["completion_token_ids"]) == row["completion_tokens"] > 0
    for earlier, later in zip(recorded, recorded[1:], strict=False):
        sampled = earlier["prompt_token_ids"] + earlier["completion_token_ids"]
        assert later["prompt_token_ids"][: len(sampled)] == sampled


def test_agent_session_with_a_function_tool(gw):
    first, second, third = run_agent(client(gw, "agent"), [SHELL_FUNCTION, {"type": "web_search"}])
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    assert first.output[0].summary[0].text == "I should list the files."
    call = first.output[1]
    assert (call.name, json.loads(call.arguments)) == ("shell", {"command": ["ls"]}) and call.call_id
    assert [item.type for item in second.output] == ["reasoning", "message"]
    assert second.output_text == "There are two files." and third.output_text == "Nothing else."
    assert {r.model for r in (first, second, third)} == {MODEL}

    recorded = rows(gw, "agent")
    check_recorded(recorded, [first, second, third])
    sent = json.loads(recorded[1]["chat_request_json"])
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
    assert sent["messages"][2]["reasoning"] == "I should list the files."
    assert [t["function"]["name"] for t in sent["tools"]] == ["shell"]  # web_search dropped
    assert json.loads(recorded[0]["request_json"])["tools"][1] == {"type": "web_search"}


def test_agent_session_with_the_local_shell_tool(gw):
    first, second, third = run_agent(client(gw, "local-shell"), [{"type": "local_shell"}])
    call = first.output[-1]
    assert call.type == "local_shell_call" and call.action.command == ["ls"]
    assert second.output_text == "There are two files." and third.output_text == "Nothing else."
    recorded = rows(gw, "local-shell")
    check_recorded(recorded, [first, second, third])
    assert json.loads(recorded[1]["chat_request_json"])["messages"][3] == {
        "role": "tool", "tool_call_id": call.call_id, "content": "a.py\nb.py"}


def test_raw_stream_events(gw):
    sdk = client(gw, "raw")
    events = list(sdk.responses.create(model=MODEL, input="What is here?", tools=[SHELL_FUNCTION],
                                       stream=True))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    [row] = rows(gw, "raw")
    assert row["stream"] and json.loads(row["response_json"]) == events[-1].response.model_dump(
        exclude_unset=True)


def test_input_tokens_count_matches_the_recorded_prompt(gw):
    sdk = client(gw, "count")
    body = {"model": MODEL, "instructions": INSTRUCTIONS, "input": [QUESTION], "tools": [SHELL_FUNCTION]}
    counted = sdk.responses.input_tokens.count(**body)
    assert counted.object == "response.input_tokens"
    assert rows(gw, "count") == []  # counting is not a completion
    sdk.responses.create(**body)
    [row] = rows(gw, "count")
    assert counted.input_tokens == row["prompt_tokens"] == len(row["prompt_token_ids"])


@pytest.fixture(scope="module")
def earlier_data(gw):
    """A stored session that bad input must leave untouched."""
    run_agent(client(gw, "before-bad-input"), [SHELL_FUNCTION])


RESPONSES = "/v1/responses"
GOOD = {"model": MODEL, "input": "hi"}


@pytest.mark.parametrize(("path", "body"), [
    (RESPONSES, b'{"model": "m", "input": ['),
    (RESPONSES, json.dumps({"model": MODEL}).encode()),
    (RESPONSES, json.dumps({**GOOD, "input": 42}).encode()),
    (RESPONSES, json.dumps({**GOOD, "input": [{"type": "teleport"}]}).encode()),
    (RESPONSES, json.dumps({**GOOD, "input": [{"role": "user", "content": [{"type": "video"}]}]}).encode()),
    (RESPONSES, json.dumps({**GOOD, "max_output_tokens": "16"}).encode()),
    (RESPONSES, json.dumps({**GOOD, "tools": {"type": "function"}}).encode()),
    (RESPONSES, json.dumps({**GOOD, "previous_response_id": "resp_1"}).encode()),
    (RESPONSES + "/input_tokens", json.dumps({"model": MODEL, "input": 3}).encode()),
], ids=["invalid-json", "missing-input", "input-type", "item-type", "part-type", "max-output-tokens-type",
        "tools-type", "previous-response-id", "input-tokens"])
def test_bad_input_is_an_openai_400_and_writes_nothing(gw, earlier_data, path: str, body: bytes):
    before = live.settled_snapshot(gw.store)
    headers = {"authorization": "Bearer sk-tap-bad-input", "content-type": "application/json"}
    response = httpx.post(gw.url + path, content=body, timeout=60, headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["message"]
    assert live.settled_snapshot(gw.store) == before
    assert len(rows(gw, "before-bad-input")) == 3


def test_bad_input_is_the_sdk_error_class(gw):
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client(gw, "sdk-error").responses.create(model=MODEL, input="hi", previous_response_id="resp_1")
    assert rows(gw, "sdk-error") == []
