"""Anthropic Messages end to end: the official `anthropic` SDK against a real `tracetap gateway` process
with the embedded engine in scripted mode; every check reads the Parquet store the gateway wrote.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import live
import pytest

MODEL = "claude-test"
COMMAND = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
BASH = {"name": "Bash", "description": "Run a shell command.", "input_schema": COMMAND}
WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search"}
LS = {"function": {"name": "Bash", "arguments": {"command": "ls"}}}
SCRIPT = [  # every session plays these in order
    {"content": "Let me look.", "tool_calls": [LS]},
    {"content": "There are two files.", "reasoning": "The listing answered it."},
    {"content": "Nothing else."},
]
QUESTION = {"role": "user", "content": [{"type": "text", "text": "What is here?",
                                         "cache_control": {"type": "ephemeral"}}]}


def system(turn: int) -> list[dict]:
    """Claude Code's system blocks: a billing line whose hash changes on every request, then the prompt."""
    return [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.0; cch={turn:05x};"},
            {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory, tracetap_home):
    with live.scripted_gateway(tmp_path_factory.mktemp("anthropic-e2e"), SCRIPT) as process:
        yield process


def client(gw, session: str) -> anthropic.Anthropic:
    """The SDK as Claude Code configures it: host root as base URL, the key names the session."""
    return anthropic.Anthropic(base_url=gw.url, api_key=f"sk-tap-{session}", max_retries=0)


def rows(gw, session: str) -> list[dict]:
    return live.store_rows(gw.store, "session_id = ?", [f"sk-tap-{session}"])


def assistant(message: anthropic.types.Message) -> dict:
    """A response as the harness sends it back: the same blocks, thinking signatures included."""
    return {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}


def run_agent(sdk: anthropic.Anthropic) -> list[anthropic.types.Message]:
    """Three turns: a tool_use, its tool_result answered over a stream (with thinking), a follow-up."""
    tools = [BASH, WEB_SEARCH]
    first = sdk.messages.create(model=MODEL, max_tokens=64, system=system(1), messages=[QUESTION],
                                tools=tools)
    result = {"type": "tool_result", "tool_use_id": first.content[-1].id, "content": "a.py\nb.py"}
    history = [QUESTION, assistant(first),
               {"role": "user", "content": [result, {"type": "text", "text": "Summarize."}]}]
    with sdk.messages.stream(model=MODEL, max_tokens=64, system=system(2), messages=history, tools=tools,
                             thinking={"type": "enabled", "budget_tokens": 32}) as stream:
        second = stream.get_final_message()
    history += [assistant(second), {"role": "user", "content": "Anything else?"}]
    third = sdk.beta.messages.create(model=MODEL, max_tokens=64, system=system(3), messages=history,
                                     tools=tools, thinking={"type": "enabled", "budget_tokens": 32})
    return [first, second, third]


def test_agent_session_is_recorded_turn_by_turn(gw):
    first, second, third = run_agent(client(gw, "agent"))
    assert [m.model for m in (first, second, third)] == [MODEL] * 3
    assert first.stop_reason == "tool_use" and [b.type for b in first.content] == ["text", "tool_use"]
    assert first.content[1].name == "Bash" and first.content[1].input == {"command": "ls"}
    assert first.content[1].id.startswith("toolu_")
    assert second.stop_reason == "end_turn" and [b.type for b in second.content] == ["thinking", "text"]
    assert second.content[0].thinking == "The listing answered it." and second.content[0].signature
    assert second.content[1].text == "There are two files." and third.content[0].text == "Nothing else."

    recorded = rows(gw, "agent")
    assert [(r["seq"], r["stream"]) for r in recorded] == [(0, False), (1, True), (2, False)]
    assert {(r["api"], r["status"]) for r in recorded} == {("anthropic_messages", "ok")}
    assert [r["finish_reason"] for r in recorded] == ["tool_calls", "stop", "stop"]
    assert [r["requested_model"] for r in recorded] == [MODEL] * 3
    for row, message in zip(recorded, (first, second, third), strict=True):
        assert json.loads(row["response_json"])["id"] == message.id
        assert message.usage.input_tokens == row["prompt_tokens"]
        assert message.usage.output_tokens == row["completion_tokens"]
        assert len(row["logprobs"]) == len(row["completion_token_ids"]) == row["completion_tokens"] > 0
    for earlier, later in zip(recorded, recorded[1:], strict=False):
        # the billing hash differs on every turn; the prompt still extends the previous one, and the
        # previous turn's sampled tokens (thinking included) re-render exactly as sampled
        sampled = earlier["prompt_token_ids"] + earlier["completion_token_ids"]
        assert later["prompt_token_ids"][: len(sampled)] == sampled
    sent = json.loads(recorded[1]["chat_request_json"])
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool", "user"]
    assert sent["messages"][0]["content"] == "You are terse."
    assert [t["function"]["name"] for t in sent["tools"]] == ["Bash"]
    harness_system = json.loads(recorded[0]["request_json"])["system"]
    assert harness_system[0]["text"].startswith("x-anthropic-billing-header")  # kept as the harness sent it


def test_raw_stream_events(gw):
    events = list(client(gw, "raw").messages.create(model=MODEL, max_tokens=64, messages=[QUESTION],
                                                    tools=[BASH], stream=True))
    kinds = [e.type for e in events]
    assert kinds == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
                     "message_stop"]
    assert [e.index for e in events if e.type == "content_block_start"] == [0, 1]
    assert events[-2].delta.stop_reason == "tool_use"
    [row] = rows(gw, "raw")
    assert row["stream"] and json.loads(row["response_json"])["id"] == events[0].message.id


def test_count_tokens_matches_the_recorded_prompt(gw):
    sdk = client(gw, "count")
    body = {"model": MODEL, "system": system(1), "messages": [QUESTION], "tools": [BASH, WEB_SEARCH]}
    counted = sdk.messages.count_tokens(**body).input_tokens
    assert sdk.beta.messages.count_tokens(**body).input_tokens == counted
    assert rows(gw, "count") == []  # counting is not a completion
    sdk.messages.create(max_tokens=64, **body)
    [row] = rows(gw, "count")
    assert counted == row["prompt_tokens"] == len(row["prompt_token_ids"])


def test_models_list_and_probes(gw):
    models = list(client(gw, "models").models.list())
    assert [(m.id, m.type) for m in models] == [("tracetap-tiny", "model")]
    for path in ("/", "/api/hello"):
        assert httpx.head(gw.url + path).status_code == 200


@pytest.fixture(scope="module")
def earlier_data(gw):
    """A stored session that bad input must leave untouched."""
    run_agent(client(gw, "before-bad-input"))


MESSAGES = "/v1/messages"
GOOD = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("path", "body"), [
    (MESSAGES, b'{"model": "m", "messages": ['),
    (MESSAGES, json.dumps({**GOOD, "max_tokens": None}).encode()),
    (MESSAGES, json.dumps({**GOOD, "max_tokens": "16"}).encode()),
    (MESSAGES, json.dumps({**GOOD, "messages": "hi"}).encode()),
    (MESSAGES, json.dumps({**GOOD, "messages": [{"role": "tool", "content": "x"}]}).encode()),
    (MESSAGES + "?beta=true", json.dumps({**GOOD, "messages": [
        {"role": "user", "content": [{"type": "video", "url": "x"}]}]}).encode()),
    (MESSAGES + "/count_tokens", json.dumps({"model": MODEL, "messages": 3}).encode()),
], ids=["invalid-json", "missing-max-tokens", "max-tokens-type", "messages-type", "role", "block-type",
        "count-tokens"])
def test_bad_input_is_an_anthropic_400_and_writes_nothing(gw, earlier_data, path: str, body: bytes):
    before = live.settled_snapshot(gw.store)
    response = httpx.post(gw.url + path, content=body, timeout=60,
                          headers={"anthropic-version": "2023-06-01", "x-api-key": "sk-tap-bad-input"})
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"]
    assert live.settled_snapshot(gw.store) == before


def test_bad_input_is_the_sdk_error_class(gw):
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client(gw, "sdk-error").messages.create(model=MODEL, max_tokens=0, messages=[QUESTION])
    assert rows(gw, "sdk-error") == []
