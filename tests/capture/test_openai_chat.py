"""The OpenAI Chat adapter: request checks and normalization, responses and synthetic streams.

The SSE stream is also read by the official SDK in test_gateway_e2e.py; here its frame order is
checked against protocols.md §4.1 on real vLLM fixture bodies.
"""

from __future__ import annotations

import json

import pytest
from live import fixture_body
from tracetap.capture.adapters import ADAPTERS
from tracetap.capture.adapters import openai_chat as adapter
from tracetap.capture.adapters.base import AdapterError, RequestContext

USER = {"role": "user", "content": "hi"}


def ctx(**request) -> RequestContext:
    return RequestContext(requested_model="gpt-test", served_model="tiny", completion_id="cmpl-1", created=7,
                          extra={"request": {"model": "gpt-test", "messages": [USER], **request}})


def fixture(name: str) -> dict:
    return json.loads(fixture_body(name))


def frames(events: list[bytes]) -> list[dict | str]:
    out = []
    for event in events:
        text = event.decode()
        assert text.startswith("data: ") and text.endswith("\n\n") and text.count("\n") == 2
        payload = text[6:-2]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_registry_holds_the_adapter():
    assert ADAPTERS["openai_chat"] is adapter


@pytest.mark.parametrize(("body", "expected"), [
    ({"model": "gpt-4o", "messages": [USER]}, {"model": "tiny", "messages": [USER]}),
    ({"messages": [{"role": "developer", "content": "be brief"}, USER]},
     {"model": "tiny", "messages": [{"role": "system", "content": "be brief"}, USER]}),
    ({"messages": [USER], "max_completion_tokens": 9},
     {"model": "tiny", "messages": [USER], "max_tokens": 9}),
    ({"messages": [USER], "max_completion_tokens": 9, "max_tokens": 4},
     {"model": "tiny", "messages": [USER], "max_tokens": 4}),
    ({"messages": [USER], "store": False, "metadata": {"a": "b"}, "user": "u", "service_tier": "auto",
      "prompt_cache_key": "k", "safety_identifier": "s"}, {"model": "tiny", "messages": [USER]}),
    ({"messages": [USER], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
      "stop": ["x"], "seed": 1, "temperature": 0.5, "top_p": 1, "response_format": {"type": "json_object"},
      "chat_template_kwargs": {"enable_thinking": False}, "stream": True, "n": 1},
     {"model": "tiny", "messages": [USER], "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": "auto", "stop": ["x"], "seed": 1, "temperature": 0.5, "top_p": 1,
      "response_format": {"type": "json_object"}, "chat_template_kwargs": {"enable_thinking": False},
      "stream": True, "n": 1}),
])
def test_request_normalization(body, expected):
    assert adapter.to_chat_request(body, ctx()) == expected


def test_request_is_not_mutated():
    body = {"messages": [{"role": "developer", "content": "x"}], "max_completion_tokens": 3}
    snapshot = json.dumps(body)
    adapter.to_chat_request(body, ctx())
    assert json.dumps(body) == snapshot


@pytest.mark.parametrize(("body", "fragment"), [
    ({}, "messages: field required"),
    ({"messages": []}, "messages: expected at least 1 item"),
    ({"messages": "hi"}, "messages: expected an array, got string"),
    ({"messages": ["hi"]}, "messages.0: expected an object, got string"),
    ({"messages": [{"content": "hi"}]}, "messages.0.role: field required"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role: expected 'system'"),
    ({"messages": [{"role": ["user"], "content": "hi"}]}, "messages.0.role: expected 'system'"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content: expected a string or an array"),
    ({"messages": [{"role": "user", "content": ["x"]}]}, "messages.0.content.0: expected an object"),
    ({"messages": [{"role": "assistant", "tool_calls": {"a": 1}}]}, "messages.0.tool_calls: expected an array"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
     "messages.0.tool_calls.0.function.name: field required"),
    ({"messages": [USER], "model": 4}, "model: expected a string, got number"),
    ({"messages": [USER], "max_tokens": "10"}, "max_tokens: expected an integer, got string"),
    ({"messages": [USER], "max_tokens": True}, "max_tokens: expected an integer, got boolean"),
    ({"messages": [USER], "temperature": "hot"}, "temperature: expected a number"),
    ({"messages": [USER], "stream": "yes"}, "stream: expected a boolean"),
    ({"messages": [USER], "stop": [1]}, "stop.0: expected a string"),
    ({"messages": [USER], "stream_options": "usage"}, "stream_options: expected an object"),
    ({"messages": [USER], "tools": {"a": 1}}, "tools: expected an array"),
    ({"messages": [USER], "tools": ["f"]}, "tools.0: expected an object"),
    ({"messages": [USER], "n": 2}, "n other than 1"),
])
def test_bad_requests(body, fragment):
    with pytest.raises(AdapterError) as error:
        adapter.to_chat_request(body, ctx())
    assert fragment in str(error.value) and error.value.status == 400


@pytest.mark.parametrize("name", ["chat_basic", "chat_tools_auto_call", "chat_top2"])
def test_response_without_token_arrays(name):
    chat = fixture(name)
    out = adapter.from_chat_response(chat, ctx())
    assert out["model"] == "gpt-test" and out["id"] == "cmpl-1"
    assert "prompt_token_ids" not in out and "token_ids" not in out["choices"][0]
    assert out["choices"][0]["logprobs"] is None
    assert out["choices"][0]["message"]["content"] == chat["choices"][0]["message"]["content"]
    assert out["usage"] == chat["usage"]
    assert chat["model"] == "tiny" and "prompt_token_ids" in chat  # the input is left alone


def test_response_keeps_logprobs_when_asked():
    chat = fixture("chat_top2")
    out = adapter.from_chat_response(chat, ctx(logprobs=True, top_logprobs=2))
    assert out["choices"][0]["logprobs"] == chat["choices"][0]["logprobs"]


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_is_mirrored(field):
    chat = fixture("chat_basic")
    chat["choices"][0]["message"][field] = "thinking"
    message = adapter.from_chat_response(chat, ctx())["choices"][0]["message"]
    assert message["reasoning"] == message["reasoning_content"] == "thinking"


def test_stream_of_a_tool_call():
    chat = fixture("chat_tools_auto_call")
    call = chat["choices"][0]["message"]["tool_calls"][0]
    events = frames(adapter.to_sse_events(chat, ctx(stream=True, stream_options={"include_usage": True})))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["id"] == "cmpl-1" and c["model"] == "gpt-test" and c["object"] == "chat.completion.chunk"
               for c in chunks)
    deltas = [c["choices"][0]["delta"] if c["choices"] else None for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1] == {"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                         "function": {"name": "Bash", "arguments": ""}}]}
    arguments = call["function"]["arguments"]
    assert deltas[2] == {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}
    assert deltas[3] == {} and chunks[3]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[4]["choices"] == [] and chunks[4]["usage"] == chat["usage"]
    assert len(chunks) == 5


def test_stream_of_text_with_reasoning_and_no_usage():
    chat = fixture("chat_length")
    chat["choices"][0]["message"]["reasoning"] = "hmm"
    events = frames(adapter.to_sse_events(chat, ctx(stream=True)))
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    assert deltas == [{"role": "assistant", "content": ""}, {"reasoning": "hmm", "reasoning_content": "hmm"},
                      {"content": chat["choices"][0]["message"]["content"]}, {}]
    assert events[-2]["choices"][0]["finish_reason"] == "length" and events[-1] == "[DONE]"


def test_stream_carries_logprobs_only_when_asked():
    chat = fixture("chat_basic")
    plain = frames(adapter.to_sse_events(chat, ctx(stream=True)))
    asked = frames(adapter.to_sse_events(chat, ctx(stream=True, logprobs=True)))
    assert all(e["choices"][0]["logprobs"] is None for e in plain[:-1])
    assert asked[-2]["choices"][0]["logprobs"] == chat["choices"][0]["logprobs"]


@pytest.mark.parametrize(("kind", "type_"), [
    ("invalid_request", "invalid_request_error"), ("not_found", "invalid_request_error"),
    ("timeout", "timeout_error"), ("upstream_unreachable", "api_error"), ("internal", "server_error"),
])
def test_error_body(kind, type_):
    assert adapter.error_body(400, "bad", kind) == {"error": {"message": "bad", "type": type_, "param": None,
                                                              "code": kind}}
