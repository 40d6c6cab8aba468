"""The Anthropic Messages adapter, both directions, against real vLLM fixtures and the official SDK.

The SDK checks serve the adapter's own output from a stdlib HTTP server on loopback and read it back
with `anthropic.Anthropic`, so the stream shape is validated by the real parser.
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anthropic
import pytest
from tracetap.capture.adapters import anthropic as adapter
from tracetap.capture.adapters.base import AdapterError, RequestContext
from tracetap.capture.adapters.chat_parts import synthetic_signature

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"
CTX = RequestContext(requested_model="claude-test", served_model="tiny", completion_id="cmpl-7",
                     path="/v1/messages")
BASH = {"name": "Bash", "description": "Run a command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
BASH_FN = {"type": "function", "function": {"name": "Bash", "description": "Run a command.",
                                             "parameters": BASH["input_schema"]}}
PNG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
PNG_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}
WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def convert(ctx: RequestContext = CTX, **fields) -> dict:
    body = {"model": "claude-test", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    return adapter.to_chat_request({**body, **fields}, ctx)


def user(*content) -> list[dict]:
    return [{"role": "user", "content": list(content)}]


def chat(message: dict, finish: str = "stop", stop_reason=None, usage: dict | None = None) -> dict:
    """A minimal vLLM-shaped chat response."""
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "tiny",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": None, **message},
                         "finish_reason": finish, "stop_reason": stop_reason}],
            "usage": usage or {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}}


# ---------------------------------------------------------------- request direction

HI = {"role": "user", "content": "hi"}


def system(text: str) -> dict:
    return {"role": "system", "content": text}


# Claude Code's title call asks for this shape in `output_config.format`.
TITLE_SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"],
                "additionalProperties": False}
REQUESTS = [
    ("system-string", {"system": "Be terse."}, {"messages": [system("Be terse."), HI]}),
    ("system-blocks-joined", {"system": [
        {"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "B"}]},
     {"messages": [system("A\n\nB"), HI]}),
    ("billing-block-dropped", {"system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=8f2a1;"},
        {"type": "text", "text": "You are Claude Code."}]},
     {"messages": [system("You are Claude Code."), HI]}),
    ("billing-line-stripped", {"system": "X-Anthropic-Billing-Header: cch=1;\nYou are Claude Code."},
     {"messages": [system("You are Claude Code."), HI]}),
    ("system-role-message", {"messages": [{"role": "user", "content": "a"},
                                          {"role": "system", "content": [{"type": "text", "text": "mid"}]}]},
     {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "mid"}]}),
    ("text-blocks-joined", {"messages": user({"type": "text", "text": "a"}, {"type": "text", "text": "b"})},
     {"messages": [{"role": "user", "content": "a\nb"}]}),
    ("image-base64", {"messages": user({"type": "text", "text": "see"}, PNG)},
     {"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, PNG_PART]}]}),
    ("image-url", {"messages": user({"type": "image", "source": {"type": "url", "url": "https://x/a.png"}})},
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]}]}),
    ("documents", {"messages": user(
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc"}},
        {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "c"}, PNG]}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}},
        {"type": "search_result", "source": "s", "title": "t", "content": [{"type": "text", "text": "r"}]})},
     {"messages": [{"role": "user", "content": "doc\nc\nr"}]}),
    ("tool-results-first", {"messages": user(
        {"type": "text", "text": "and then?"},
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "out"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
         "content": [{"type": "text", "text": "boom"}, {"type": "text", "text": "trace"}]})},
     {"messages": [{"role": "tool", "tool_call_id": "toolu_1", "content": "out"},
                   {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom\ntrace"},
                   {"role": "user", "content": "and then?"}]}),
    ("tool-result-only", {"messages": user({"type": "tool_result", "tool_use_id": "t", "is_error": True})},
     {"messages": [{"role": "tool", "tool_call_id": "t", "content": "Error"}]}),
    ("tool-result-images", {"messages": user(
        {"type": "tool_result", "tool_use_id": "t",
         "content": [{"type": "text", "text": "shot"}, PNG, {"type": "tool_reference", "tool_name": "x"}]},
        {"type": "text", "text": "look"})},
     {"messages": [{"role": "tool", "tool_call_id": "t", "content": "shot"},
                   {"role": "user", "content": [PNG_PART, {"type": "text", "text": "look"}]}]}),
    ("assistant-blocks", {"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "plan", "signature": "whatever"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "Running."},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
        {"type": "tool_use", "id": "toolu_9", "name": "Bash", "input": {"command": "ls"}}]}]},
     {"messages": [{"role": "user", "content": "go"},
                   {"role": "assistant", "content": "Running.", "reasoning": "plan", "tool_calls": [
                       {"id": "toolu_9", "type": "function",
                        "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]}]}),
    ("assistant-raw-arguments-restored", {"messages": [{"role": "user", "content": "go"}, {
        "role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash",
                                          "input": {"_raw": '{"command": "ls'}}]}]},
     {"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [
         {"id": "t", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls'}}]}]}),
    ("tools-and-auto", {"tools": [BASH, WEB_SEARCH], "tool_choice": {"type": "auto"}},
     {"tools": [BASH_FN], "tool_choice": "auto"}),
    ("tool-choice-any", {"tools": [{**BASH, "type": "custom"}], "tool_choice": {"type": "any"}},
     {"tools": [BASH_FN], "tool_choice": "required"}),
    ("tool-choice-named", {"tools": [BASH], "tool_choice": {"type": "tool", "name": "Bash",
                                                           "disable_parallel_tool_use": True}},
     {"tools": [BASH_FN], "tool_choice": {"type": "function", "function": {"name": "Bash"}},
      "parallel_tool_calls": False}),
    ("tool-choice-none", {"tools": [BASH], "tool_choice": {"type": "none"}},
     {"tools": [BASH_FN], "tool_choice": "none"}),
    ("tool-choice-without-tools", {"tools": [], "tool_choice": {"type": "any"}},
     {"tools": None, "tool_choice": None}),
    ("only-server-tools", {"tools": [WEB_SEARCH, {"type": "bash_20250124", "name": "bash"}],
                           "tool_choice": {"type": "auto"}},
     {"tools": None, "tool_choice": None}),
    ("sampling", {"temperature": 0.5, "top_p": 0.9, "top_k": 20, "stop_sequences": ["END"]},
     {"temperature": 0.5, "top_p": 0.9, "top_k": 20, "stop": ["END"]}),
    ("empty-stop-sequences", {"stop_sequences": []}, {"stop": None}),
    ("thinking-enabled", {"thinking": {"type": "enabled", "budget_tokens": 1024}},
     {"chat_template_kwargs": {"enable_thinking": True}}),
    ("thinking-adaptive", {"thinking": {"type": "adaptive"}},
     {"chat_template_kwargs": {"enable_thinking": True}}),
    ("thinking-disabled", {"thinking": {"type": "disabled"}},
     {"chat_template_kwargs": {"enable_thinking": False}}),
    ("ignored-fields", {"metadata": {"user_id": "u"}, "context_management": {"edits": []}, "stream": True,
                        "output_config": {"effort": "high"}, "cache_control": {"type": "ephemeral"}},
     {"metadata": None, "context_management": None, "output_config": None, "cache_control": None,
      "stream": None, "model": "tiny", "max_tokens": 64, "response_format": None}),
    ("output-config-format", {"output_config": {"format": {"type": "json_schema", "schema": TITLE_SCHEMA}}},
     {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": TITLE_SCHEMA}},
      "output_config": None}),
    ("output-config-format-named", {"output_config": {"effort": "low", "format": {
        "type": "json_schema", "name": "title", "schema": TITLE_SCHEMA}}},
     {"response_format": {"type": "json_schema", "json_schema": {"name": "title", "schema": TITLE_SCHEMA}}}),
]


@pytest.mark.parametrize("fields,expected", [c[1:] for c in REQUESTS], ids=[c[0] for c in REQUESTS])
def test_request_conversion(fields: dict, expected: dict):
    out = convert(**fields)
    for key, value in expected.items():
        assert out.get(key) == value, key


def test_history_fixture_converts_like_chat_history():
    """vLLM renders both requests to the same 228 prompt tokens; only the tool-call id differs."""
    body = fixture("anthropic_messages_history.request")["body"]
    wanted = fixture("chat_history.request")["body"]
    out = adapter.to_chat_request(body, CTX)
    for message in wanted["messages"]:
        message.pop("tool_call_id", None)
        for call in message.get("tool_calls") or []:
            call.pop("id")
    for message in out["messages"]:
        message.pop("tool_call_id", None)
        for call in message.get("tool_calls") or []:
            call.pop("id")
    assert out["messages"] == wanted["messages"]
    assert out["tools"] == wanted["tools"]


def test_count_tokens_body_needs_no_max_tokens():
    body = fixture("anthropic_count_tokens_tools.request")["body"]
    ctx = RequestContext("tiny", "tiny", path="/v1/messages/count_tokens?beta=true")
    out = adapter.to_chat_request(body, ctx)
    assert "max_tokens" not in out and out["tools"][0]["function"]["name"] == "Bash"
    with pytest.raises(AdapterError, match="max_tokens"):
        adapter.to_chat_request(body, CTX)
    assert adapter.count_tokens_body(27) == {"input_tokens": 27}


def test_input_is_not_mutated():
    body = fixture("anthropic_messages_history.request")["body"]
    before = copy.deepcopy(body)
    adapter.to_chat_request(body, CTX)
    assert body == before


BAD_REQUESTS = [
    ("not-an-object", ["messages"], "JSON object"),
    ("missing-messages", {"messages": None}, "messages: field required"),
    ("messages-not-array", {"messages": "hi"}, "messages: expected an array"),
    ("no-messages", {"messages": []}, "messages: expected at least 1 item"),
    ("missing-max-tokens", {"max_tokens": None}, "max_tokens: field required"),
    ("max-tokens-string", {"max_tokens": "64"}, "max_tokens: expected an integer, got string"),
    ("max-tokens-bool", {"max_tokens": True}, "got boolean"),
    ("max-tokens-zero", {"max_tokens": 0}, "at least 1"),
    ("missing-model", {"model": None}, "model: field required"),
    ("stream-not-bool", {"stream": "yes"}, "stream: expected a boolean"),
    ("role-tool", {"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ("message-not-object", {"messages": ["hi"]}, "messages.0: expected an object"),
    ("content-number", {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ("block-without-type", {"messages": user({"text": "x"})}, "messages.0.content.0"),
    ("unknown-block", {"messages": user({"type": "video", "url": "x"})}, "'video' is not supported"),
    ("tool-use-from-user", {"messages": user({"type": "tool_use", "id": "t", "name": "n", "input": {}})},
     "'tool_use' is not supported in a user message"),
    ("image-from-assistant", {"messages": [{"role": "assistant", "content": [PNG]}]},
     "'image' is not supported in a assistant message"),
    ("text-not-string", {"messages": user({"type": "text", "text": 3})}, "messages.0.content.0.text"),
    ("image-file-source", {"messages": user({"type": "image", "source": {"type": "file", "file_id": "f"}})},
     "unsupported image source 'file'"),
    ("tool-result-without-id", {"messages": user({"type": "tool_result", "content": "x"})}, "tool_use_id"),
    ("tool-result-odd-part", {"messages": user({"type": "tool_result", "tool_use_id": "t",
                                                "content": [{"type": "tool_use"}]})}, "in a tool_result"),
    ("tool-result-error-flag",
     {"messages": user({"type": "tool_result", "tool_use_id": "t", "is_error": "y"})},
     "is_error: expected a boolean"),
    ("tool-use-input-string", {"messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "n", "input": "{}"}]}]}, "input: expected an object"),
    ("thinking-not-string", {"messages": [{"role": "assistant", "content": [{"type": "thinking"}]}]},
     "thinking"),
    ("tools-not-array", {"tools": {"name": "x"}}, "tools: expected an array"),
    ("tool-without-name", {"tools": [{"input_schema": {}}]}, "tools.0.name: field required"),
    ("tool-without-schema", {"tools": [{"name": "x"}]}, "tools.0.input_schema"),
    ("tool-choice-unknown", {"tools": [BASH], "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ("tool-choice-unknown-without-tools", {"tool_choice": "auto"}, "tool_choice"),
    ("tool-choice-missing-tool", {"tools": [BASH], "tool_choice": {"type": "tool", "name": "Read"}},
     "no tool named 'Read'"),
    ("stop-sequences-not-strings", {"stop_sequences": [1]}, "stop_sequences"),
    ("temperature-string", {"temperature": "0.2"}, "temperature: expected a number"),
    ("top-k-float", {"top_k": 2.5}, "top_k: expected an integer"),
    ("thinking-unknown", {"thinking": {"type": "maximal"}}, "thinking"),
    ("system-number", {"system": 7}, "system"),
    ("system-image", {"system": [PNG]}, "system.0"),
    ("output-format-unknown", {"output_config": {"format": {"type": "xml"}}}, "output_config.format.type"),
    ("output-format-without-schema", {"output_config": {"format": {"type": "json_schema"}}},
     "output_config.format.schema: field required"),
    ("thinking-type-unhashable", {"thinking": {"type": ["enabled"]}}, "thinking.type: expected 'enabled'"),
    ("role-unhashable", {"messages": [{"role": ["user"], "content": "x"}]}, "messages.0.role: expected 'user'"),
]


@pytest.mark.parametrize("fields,fragment", [case[1:] for case in BAD_REQUESTS],
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_request_raises_invalid_request(fields, fragment: str):
    with pytest.raises(AdapterError, match=fragment.replace("(", r"\(")) as info:
        if isinstance(fields, dict):
            convert(**fields)
        else:
            adapter.to_chat_request(fields, CTX)
    assert (info.value.status, info.value.kind) == (400, "invalid_request")


# ---------------------------------------------------------------- response direction

RESPONSES = [
    ("auto-tool-call", fixture("chat_tools_auto_call"), "tool_use", None, ["tool_use"]),
    ("named-tool-call-stop", fixture("chat_tools_named_strict"), "tool_use", None, ["tool_use"]),
    ("stop-string", fixture("chat_stop"), "stop_sequence", " Unfortunately", ["text"]),
    ("stop-token-id", fixture("chat_stop_token_ids"), "end_turn", None, ["text"]),
    ("eos-empty", fixture("chat_eos"), "end_turn", None, ["text"]),
    ("length", fixture("chat_length"), "max_tokens", None, ["text"]),
    ("reasoning-text-tool", chat({"reasoning": "think", "content": "ok", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}]}, "tool_calls"),
     "tool_use", None, ["thinking", "text", "tool_use"]),
    ("reasoning-content-alias", chat({"reasoning_content": "old", "content": "x"}), "end_turn", None,
     ["thinking", "text"]),
    ("content-filter", chat({"content": "no"}, "content_filter"), "refusal", None, ["text"]),
    ("no-choices", {"choices": [], "usage": None}, "end_turn", None, ["text"]),
]


@pytest.mark.parametrize("upstream,stop_reason,stop_sequence,kinds", [c[1:] for c in RESPONSES],
                         ids=[c[0] for c in RESPONSES])
def test_response_conversion(upstream: dict, stop_reason: str, stop_sequence, kinds: list[str]):
    message = adapter.from_chat_response(upstream, CTX)
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["model"] == "claude-test"
    assert message["id"].startswith("msg_")
    assert message["id"] == adapter.from_chat_response(upstream, CTX)["id"]
    assert (message["stop_reason"], message["stop_sequence"]) == (stop_reason, stop_sequence)
    assert [block["type"] for block in message["content"]] == kinds
    usage = (upstream.get("usage") or {})
    assert message["usage"] == {"input_tokens": usage.get("prompt_tokens", 0),
                                "output_tokens": usage.get("completion_tokens", 0),
                                "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}


def test_message_id_follows_completion_id():
    contexts = [RequestContext("m", "m", completion_id=c) for c in "ab"]
    ids = {adapter.from_chat_response(chat({}), ctx)["id"] for ctx in contexts}
    assert len(ids) == 2 and all(len(i) == len("msg_") + 24 for i in ids)


@pytest.mark.parametrize("arguments,expected", [
    ('{"command": "ls"}', {"command": "ls"}),
    ("", {}),
    (None, {}),
    ('{"command": "ls', {"_raw": '{"command": "ls'}),
    ('"just a string"', {"_raw": '"just a string"'}),
    ("[1, 2]", {"_raw": "[1, 2]"}),
])
def test_tool_input_parsing(arguments, expected):
    upstream = chat({"tool_calls": [{"id": "c", "type": "function",
                                     "function": {"name": "Bash", "arguments": arguments}}]}, "tool_calls")
    assert adapter.from_chat_response(upstream, CTX)["content"][0]["input"] == expected


@pytest.mark.parametrize("upstream_id,expected", [
    ("toolu_01ABC", "toolu_01ABC"),
    ("chatcmpl-tool-9a1b", "toolu_chatcmpl-tool-9a1b"),
    ("call:1/x", "toolu_call_1_x"),
])
def test_tool_use_ids_look_like_anthropic(upstream_id: str, expected: str):
    upstream = chat({"tool_calls": [{"id": upstream_id, "type": "function",
                                     "function": {"name": "Bash", "arguments": "{}"}}]}, "tool_calls")
    assert adapter.from_chat_response(upstream, CTX)["content"][0]["id"] == expected


def test_missing_tool_ids_are_deterministic_and_distinct():
    calls = [{"type": "function", "function": {"name": "Bash", "arguments": "{}"}}] * 2
    first = [b["id"] for b in adapter.from_chat_response(chat({"tool_calls": calls}), CTX)["content"]]
    again = [b["id"] for b in adapter.from_chat_response(chat({"tool_calls": calls}), CTX)["content"]]
    assert first == again and len(set(first)) == 2 and all(i.startswith("toolu_") for i in first)


def test_cached_prompt_tokens_split_out_of_input_tokens():
    usage = {"prompt_tokens": 100, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 64}}
    assert adapter.from_chat_response(chat({"content": "x"}, usage=usage), CTX)["usage"] == {
        "input_tokens": 36, "output_tokens": 7,
        "cache_read_input_tokens": 64, "cache_creation_input_tokens": 0,
    }


def test_thinking_signature_is_deterministic():
    block = adapter.from_chat_response(chat({"reasoning": "step one"}), CTX)["content"][0]
    assert block == {"type": "thinking", "thinking": "step one", "signature": synthetic_signature("step one")}
    assert synthetic_signature("step one") != synthetic_signature("step two")


@pytest.mark.parametrize("message", [
    {"reasoning": "look first", "content": "Listing.", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "Bash", "arguments": '{"command": "ls -la"}'}}]},
    {"content": None, "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "l'}}]},
    {"reasoning": "only thinking", "content": "done"},
])
def test_round_trip_reproduces_the_assistant_turn(message: dict):
    """Response -> harness history -> next request gives back the assistant message the model produced."""
    anthropic_message = adapter.from_chat_response(chat(message, "tool_calls"), CTX)
    history = [{"role": "user", "content": "go"}, {"role": anthropic_message["role"],
                                                   "content": anthropic_message["content"]}]
    again = convert(messages=history)["messages"][1]
    expected = {"role": "assistant", **message}
    for got, want in zip(again.get("tool_calls", []), expected.get("tool_calls", []), strict=True):
        assert got["id"].endswith(want["id"])
        got["id"] = want["id"]
    assert again == expected


# ---------------------------------------------------------------- SSE


def parse_sse(frames: list[bytes]) -> list[tuple[str, dict]]:
    events = []
    for frame in frames:
        lines = frame.decode().split("\n")
        assert lines[-2:] == ["", ""] and len(lines) == 4, frame
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ")
        data = json.loads(lines[1][len("data: "):])
        assert data["type"] == lines[0][len("event: "):]
        events.append((data["type"], data))
    return events


def fold(events: list[tuple[str, dict]]) -> list[dict]:
    """Rebuild content the way the SDK does: append on start, apply deltas by index."""
    blocks: list[dict] = []
    partial: dict[int, str] = {}
    for kind, data in events:
        if kind == "content_block_start":
            assert data["index"] == len(blocks)
            blocks.append(copy.deepcopy(data["content_block"]))
        elif kind == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            field = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}
            if delta["type"] == "input_json_delta":
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
                block["input"] = json.loads(partial[data["index"]])
            else:
                block[field[delta["type"]]] += delta[delta["type"].removesuffix("_delta")]
    return blocks


STREAMED = [RESPONSES[0], RESPONSES[2], RESPONSES[4], RESPONSES[6]]


@pytest.mark.parametrize("upstream", [c[1] for c in STREAMED], ids=[c[0] for c in STREAMED])
def test_sse_event_order_and_indexes(upstream: dict):
    events = parse_sse(adapter.to_sse_events(upstream, CTX))
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    opened = None
    for kind, data in events[1:-2]:
        if kind == "content_block_start":
            assert opened is None
            opened = data["index"]
        else:
            assert data["index"] == opened
            if kind == "content_block_stop":
                opened = None
    assert opened is None
    message = adapter.from_chat_response(upstream, CTX)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["id"] == message["id"]
    assert start["usage"]["input_tokens"] == message["usage"]["input_tokens"]
    assert fold(events) == message["content"]
    delta = events[-2][1]
    assert delta["delta"] == {key: message[key] for key in ("stop_reason", "stop_sequence")}
    assert delta["usage"]["output_tokens"] == message["usage"]["output_tokens"]


def test_thinking_block_ends_with_signature_before_stop():
    events = parse_sse(adapter.to_sse_events(chat({"reasoning": "hmm", "content": "ok"}), CTX))
    kinds = [(kind, data.get("delta", {}).get("type")) for kind, data in events]
    assert kinds[1:5] == [("content_block_start", None), ("content_block_delta", "thinking_delta"),
                          ("content_block_delta", "signature_delta"), ("content_block_stop", None)]


def test_empty_response_streams_one_empty_text_block():
    events = parse_sse(adapter.to_sse_events(fixture("chat_eos"), CTX))
    assert [kind for kind, _ in events] == ["message_start", "content_block_start", "content_block_stop",
                                            "message_delta", "message_stop"]
    assert events[1][1]["content_block"] == {"type": "text", "text": ""}


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("status,kind,error_type", [
    (400, "invalid_request", "invalid_request_error"),
    (404, "not_found", "not_found_error"),
    (413, "payload_too_large", "request_too_large"),
    (504, "timeout", "timeout_error"),
    (502, "upstream_unreachable", "api_error"),
    (500, "internal", "api_error"),
    (400, "upstream_error", "invalid_request_error"),
    (401, "upstream_error", "authentication_error"),
    (429, "upstream_error", "rate_limit_error"),
    (503, "upstream_error", "api_error"),
    (529, "upstream_error", "overloaded_error"),
])
def test_error_body_types(status: int, kind: str, error_type: str):
    assert adapter.error_body(status, "nope", kind) == {
        "type": "error", "error": {"type": error_type, "message": "nope"}, "request_id": None}


def test_context_overflow_says_prompt_is_too_long():
    upstream = fixture("error_context_overflow")["error"]["message"]
    message = adapter.error_body(400, upstream, "upstream_error")["error"]["message"]
    assert message.startswith("prompt is too long") and upstream in message


def test_error_event_is_an_sse_error_frame():
    body = b'{"type":"error","error":{"type":"api_error","message":"gone"},"request_id":null}'
    frame = adapter.error_event(502, "gone", "upstream_unreachable")
    assert frame == b"event: error\ndata: " + body + b"\n\n"


# ---------------------------------------------------------------- the official SDK reads our output


class _Stub(BaseHTTPRequestHandler):
    """Answers POST /v1/messages with the adapter's JSON or SSE for the server's `upstream` chat."""

    def do_POST(self):  # noqa: N802 (stdlib hook name)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        mode, arg = self.server.reply
        status, kind = 200, "application/json"
        if mode == "error":
            status, payload = arg, json.dumps(adapter.error_body(arg, "bad", "invalid_request")).encode()
        elif body.get("stream"):
            kind, payload = "text/event-stream", b"".join(adapter.to_sse_events(arg, CTX))
            if mode == "broken":  # cut mid-block and fail the way a gateway does once SSE has begun
                payload = payload.split(b"event: content_block_stop")[0]
                payload += adapter.error_event(500, "x", "internal")
        else:
            payload = json.dumps(adapter.from_chat_response(arg, CTX)).encode()
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{server.server_port}"
    client = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0)
    yield server, client
    server.shutdown()
    server.server_close()
    thread.join()


REQUEST = {"model": "claude-test", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("upstream", [c[1] for c in RESPONSES if c[0] != "no-choices"],
                         ids=[c[0] for c in RESPONSES if c[0] != "no-choices"])
def test_sdk_stream_and_create_agree(stub, upstream: dict):
    server, client = stub
    server.reply = ("ok", upstream)
    expected = adapter.from_chat_response(upstream, CTX)
    created = client.messages.create(**REQUEST)
    with client.messages.stream(**REQUEST) as stream:
        final = stream.get_final_message()
    parsed = anthropic.types.Message.model_validate(expected).model_dump()
    assert created.model_dump() == final.model_dump() == parsed
    assert [block.type for block in final.content] == [block["type"] for block in expected["content"]]
    raw = [event.type for event in client.messages.create(**REQUEST, stream=True)]
    assert raw[0] == "message_start" and raw[-1] == "message_stop" and "content_block_stop" in raw


def test_sdk_raises_its_own_errors(stub):
    server, client = stub
    server.reply = ("error", 400)
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(**REQUEST)
    assert info.value.body["error"]["type"] == "invalid_request_error"
    server.reply = ("broken", chat({"content": "partial"}))
    with pytest.raises(anthropic.APIStatusError, match="api_error"):
        with client.messages.stream(**REQUEST) as stream:
            stream.get_final_message()
