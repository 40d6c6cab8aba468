"""Request validation: defaults, vLLM's field precedence, and errors in vLLM's shape."""

from __future__ import annotations

import pytest
from tracetap.engine.request import ChatRequest, EngineError, parse_chat, parse_completion, parse_json

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "Bash"}}]


def test_defaults() -> None:
    request = parse_chat({"messages": MESSAGES}, 4096)
    assert request == ChatRequest(messages=MESSAGES)
    assert (request.temperature, request.top_p, request.max_tokens, request.stop) == (1.0, 1.0, None, [])


def test_fields_are_read() -> None:
    named = {"type": "function", "function": {"name": "Bash"}}
    request = parse_chat({
        "messages": MESSAGES, "tools": TOOLS, "tool_choice": named,
        "max_tokens": 9, "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "seed": 3, "stop": "END",
        "stop_token_ids": [198], "logprobs": True, "top_logprobs": 2, "return_token_ids": True,
        "chat_template_kwargs": {"enable_thinking": False}, "stream": True,
        "stream_options": {"include_usage": True}, "model": "any-name-at-all", "unknown_field": 1,
    }, 4096)
    assert request.max_tokens == 7 and request.stop == ["END"] and request.stop_token_ids == [198]
    assert (request.temperature, request.top_p, request.seed, request.top_logprobs) == (0.0, 0.5, 3, 2)
    assert request.template_kwargs == {"enable_thinking": False} and request.include_usage and request.stream
    assert request.parse_tools


def test_structured_outputs_are_kept_on_both_routes() -> None:
    """Accepted as vLLM accepts them (the server logs them as not enforced), unknown fields left out."""
    given = {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"}, "guided_json": {}}
    assert parse_chat({"messages": MESSAGES, **given}, 4096).constraints == {
        "response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"}}
    assert parse_completion({"prompt": [1, 2], **given}, 4096).constraints == {
        "response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"}}
    assert parse_completion({"prompt": [1, 2]}, 4096).constraints == {}


@pytest.mark.parametrize(
    ("choice", "parses"), [(None, True), ("auto", True), ("required", True), ("none", False)],
)
def test_tool_parsing_follows_tool_choice(choice, parses: bool) -> None:
    offered = parse_chat({"messages": MESSAGES, "tools": TOOLS, "tool_choice": choice}, 4096)
    assert offered.parse_tools is parses
    assert parse_chat({"messages": MESSAGES, "tool_choice": choice}, 4096).parse_tools is False


@pytest.mark.parametrize(
    ("body", "kind", "param"),
    [
        ({}, "Bad Request", "body.messages"),
        ({"messages": []}, "Bad Request", "body.messages"),
        ({"messages": "hi"}, "Bad Request", "body.messages"),
        ({"messages": [{"content": "x"}]}, "Bad Request", "body.messages.0"),
        ({"messages": MESSAGES, "max_tokens": 4097}, "BadRequestError", "max_tokens"),
        ({"messages": MESSAGES, "max_completion_tokens": 0}, "BadRequestError", "max_completion_tokens"),
        ({"messages": MESSAGES, "max_tokens": "9"}, "Bad Request", "body.max_tokens"),
        ({"messages": MESSAGES, "temperature": 2.5}, "BadRequestError", "temperature"),
        ({"messages": MESSAGES, "top_p": 0}, "BadRequestError", "top_p"),
        ({"messages": MESSAGES, "seed": True}, "Bad Request", "body.seed"),
        ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "BadRequestError", "top_logprobs"),
        ({"messages": MESSAGES, "top_logprobs": 1}, "BadRequestError", "top_logprobs"),
        ({"messages": MESSAGES, "stop": [1]}, "Bad Request", "body.stop"),
        ({"messages": MESSAGES, "n": 2}, "BadRequestError", "n"),
        ({"messages": MESSAGES, "stop_token_ids": ["a"]}, "Bad Request", "body.stop_token_ids"),
        ({"messages": MESSAGES, "tool_choice": {"function": {"name": "Bash"}}}, "BadRequestError",
         "tool_choice"),  # named tool, but no tools offered
        ({"messages": MESSAGES, "tools": TOOLS, "tool_choice": "sometimes"}, "BadRequestError",
         "tool_choice"),
        ({"messages": MESSAGES, "response_format": "json"}, "Bad Request", "body.response_format"),
    ],
)
def test_rejections(body: dict, kind: str, param: str) -> None:
    with pytest.raises(EngineError) as caught:
        parse_chat(body, 4096)
    error = caught.value.body()["error"]
    assert (error["type"], error["param"], error["code"]) == (kind, param, 400)


@pytest.mark.parametrize(
    ("raw", "param"), [(b"{", "body.1"), (b"[1]", "body"), (b"\xff", "body.0"), (b"", "body.0")],
)
def test_parse_json_rejects_non_objects(raw: bytes, param: str) -> None:
    with pytest.raises(EngineError) as caught:
        parse_json(raw)
    assert caught.value.param == param and caught.value.status == 400
