"""Replay matching: what counts as the same call, and how a miss is explained. Requests come from the real
adapters (the same conversation said through different APIs) and from the real vLLM fixtures."""

from __future__ import annotations

import json

import pytest
from live import fixture_request
from tracetap.capture.adapters import ADAPTERS
from tracetap.capture.adapters.base import RequestContext
from tracetap.capture.replay_match import canonical, check_ignore_path, closest, differences, match_key
from tracetap.capture.upstream import with_token_flags

COMMAND = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
CHAT_TOOL = {"type": "function", "function": {"name": "Bash", "description": "Run.", "parameters": COMMAND}}
BASE = {"model": "tracetap-tiny", "max_tokens": 64, "tools": [CHAT_TOOL],
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is here?"}]}


def key(request: dict, *ignore: str) -> str:
    return match_key(canonical(with_token_flags(request), ignore))


def chat_of(api: str, body: dict, model: str) -> dict:
    """What the gateway sends upstream for `body` said in `api`."""
    ctx = RequestContext(requested_model=model, served_model="tracetap-tiny", extra={"request": body})
    return ADAPTERS[api].to_chat_request(body, ctx)


def with_turn(call_id: str, arguments: str, reasoning_key: str = "reasoning") -> dict:
    """BASE plus an assistant tool call, its result, and an assistant answer with reasoning."""
    call = {"id": call_id, "type": "function", "function": {"name": "Bash", "arguments": arguments}}
    answer = {"role": "assistant", "content": "Two files.", reasoning_key: "Listed."}
    return {**BASE, "messages": [*BASE["messages"], {"role": "assistant", "content": "Look.", "tool_calls": [call]},
                                 {"role": "tool", "tool_call_id": call_id, "content": "a.py"}, answer,
                                 {"role": "user", "content": "More?"}]}


@pytest.mark.parametrize("change", [
    {"model": "gpt-4o"}, {"stream": True, "stream_options": {"include_usage": True}}, {"user": "u-1"},
    {"metadata": {"run": "7"}}, {"logprobs": True}, {"temperature": None}, {"return_token_ids": True},
], ids=["model", "stream", "user", "metadata", "logprobs", "null", "token-flag"])
def test_volatile_fields_do_not_change_the_key(change):
    assert key({**BASE, **change}) == key(BASE)


@pytest.mark.parametrize("change", [
    {"max_tokens": 65}, {"temperature": 0.5}, {"tools": []}, {"top_logprobs": 3, "logprobs": True},
    {"messages": [*BASE["messages"][:1], {"role": "user", "content": "What is there?"}]},
], ids=["max-tokens", "temperature", "tools", "top-logprobs", "content"])
def test_what_the_model_sees_changes_the_key(change):
    assert key({**BASE, **change}) != key(BASE)


def test_tool_call_ids_spelling_and_reasoning_alias_do_not_change_the_key():
    one = with_turn("chatcmpl-tool-1a2b", '{"command": "ls"}')
    two = with_turn("toolu_9f", '{"command":"ls"}', "reasoning_content")
    assert key(one) == key(two)
    assert key(one) != key(with_turn("chatcmpl-tool-1a2b", '{"command": "pwd"}'))


def test_tool_call_links_still_count():
    """Which call a result answers is part of the conversation; only the id spelling is not."""
    linked = with_turn("a", "{}")
    unlinked = json.loads(json.dumps(linked).replace('"tool_call_id": "a"', '"tool_call_id": "b"'))
    assert key(linked) != key(unlinked)


def test_the_same_conversation_through_anthropic_matches_chat():
    anthropic = {"model": "claude-x", "max_tokens": 64, "tools": [
        {"name": "Bash", "description": "Run.", "input_schema": COMMAND}],
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2; cch=ab12;"},
                   {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "What is here?"}]}
    billed_again = json.loads(json.dumps(anthropic).replace("cch=ab12", "cch=ff00"))
    chat = chat_of("openai_chat", {**BASE, "model": "gpt-4o"}, "gpt-4o")
    assert key(chat_of("anthropic_messages", anthropic, "claude-x")) == key(chat)
    assert key(chat_of("anthropic_messages", billed_again, "claude-x")) == key(chat)


@pytest.mark.parametrize(("ignore", "change"), [
    ("temperature", {"temperature": 0.9}),
    ("tools.*.function.description", {"tools": [{**CHAT_TOOL, "function": {**CHAT_TOOL["function"],
                                                                          "description": "Run it."}}]}),
    ("messages.0.content", {"messages": [{"role": "system", "content": "Today is Monday."}, BASE["messages"][1]]}),
])
def test_ignored_paths_do_not_change_the_key(ignore, change):
    assert key({**BASE, **change}, ignore) == key(BASE, ignore)
    assert key({**BASE, **change}) != key(BASE)


def test_ignoring_a_list_item_keeps_the_others_in_place():
    request = canonical(BASE, ["messages.0"])
    assert request["messages"] == [None, BASE["messages"][1]]


@pytest.mark.parametrize("path", ["", "a..b", ".a", "a."])
def test_bad_ignore_paths_are_refused(path):
    with pytest.raises(ValueError, match="ignore path"):
        check_ignore_path(path)


def test_secrets_are_masked_like_the_recorder_masks_them():
    """A recorded request has its credential-looking values masked; a live one must match it."""
    live = {**BASE, "extra_body": {"api_key": "sk-live-123"}}
    recorded = {**BASE, "extra_body": {"api_key": "[redacted]"}}
    assert key(live) == key(recorded)


@pytest.mark.parametrize("fixture", ["chat_basic", "chat_history", "chat_tools_auto_call", "chat_top2"])
def test_a_call_recorded_in_front_of_sglang_matches_in_front_of_vllm(fixture):
    """Each engine gets its own token flags; the request recorded is the same call."""
    body = fixture_request(fixture)
    recorded = json.loads(json.dumps(with_token_flags(body, "sglang")))
    assert match_key(canonical(recorded)) == match_key(canonical(with_token_flags(body, "vllm")))


def test_differences_name_each_path():
    recorded = canonical(with_turn("x", '{"command": "ls"}'))
    incoming = canonical({**with_turn("y", '{"command": "pwd"}'), "temperature": 0.2})
    incoming["messages"] = incoming["messages"][:-1]
    assert differences(recorded, incoming) == [
        'messages.2.tool_calls.0.function.arguments.command: recorded "ls", this request "pwd"',
        "messages: 6 items recorded, 5 in this request",
        "temperature: only in this request (0.2)",
    ]
    assert differences(recorded, recorded) == []
    assert differences({"n": 1}, {"n": True}) == ["n: recorded 1, this request true"]


def test_long_values_are_shortened():
    [line] = differences({"content": "x" * 500}, {"content": "y"})
    assert len(line) < 140 and line.endswith('this request "y"')


def test_closest_has_the_fewest_differences():
    incoming = canonical(with_turn("a", "{}"))
    far = canonical({**BASE, "max_tokens": 5})
    near = canonical({**with_turn("a", "{}"), "max_tokens": 5})
    label, found = closest(incoming, [("far", far), ("near", near), ("also-near", near)])
    assert (label, found) == ("near", ["max_tokens: recorded 5, this request 64"])
    assert closest(incoming, []) is None
