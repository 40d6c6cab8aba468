"""Generated text -> assistant message: reasoning, Hermes tool calls, content."""

from __future__ import annotations

import json

import pytest
from tracetap.tokens.parsing import find_stop, parse_reply, split_reasoning, thinking_open

CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
LS, PWD = ("Bash", {"command": "ls"}), ("Bash", {"command": "pwd"})
BROKEN = '<tool_call>\n{"name": "Bash", "arguments": {broken\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "content", "reasoning", "calls"),
    [
        ("plain text", "plain text", None, []),
        (CALL, None, None, [LS]),
        ("Looking.\n" + CALL, "Looking.", None, [LS]),
        (CALL + "\n" + CALL.replace("ls", "pwd"), None, None, [LS, PWD]),
        ("<think>\nplan\n</think>\n\nanswer", "answer", "plan", []),
        ("plan only</think>\n\n" + CALL, None, "plan only", [LS]),
        ("<think>\nstill thinking", None, "still thinking", []),
        ("<think>\nplan\n</think>\n\n", None, "plan", []),
        ("<think>\n\n</think>\n\nhi", "hi", None, []),
        (BROKEN, None, None, None),  # raw text kept
        ('<tool_call>\n["not", "an", "object"]\n</tool_call>', None, None, None),
        ("<tool_call>\n{\"name\": \"Bash\"", None, None, None),  # cut off before the closing tag
    ],
)
def test_parse_reply(text: str, content, reasoning, calls) -> None:
    message = parse_reply(text, parse_tools=True)
    if calls is None:  # unparsable: everything stays content, no calls
        assert message == {"content": text, "reasoning": None, "tool_calls": []}
        return
    assert (message["content"], message["reasoning"]) == (content, reasoning)
    parsed = message["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == calls
    assert all(c["type"] == "function" and c["id"].startswith("chatcmpl-tool-") for c in parsed)


def test_arguments_are_reserialized_like_vllm() -> None:
    text = '<tool_call>{"name":"f","arguments":{"q":"東京","n":1}}</tool_call>'
    (call,) = parse_reply(text, True)["tool_calls"]
    assert call["function"]["arguments"] == '{"q": "東京", "n": 1}'


def test_tool_calls_stay_text_when_tools_are_off() -> None:
    assert parse_reply(CALL, parse_tools=False) == {"content": CALL, "reasoning": None, "tool_calls": []}


@pytest.mark.parametrize(
    ("text", "stops", "expected"),
    [
        ("abc stop def", ["stop"], (4, "stop")),
        ("a b c", ["x"], None),
        ("x y", ["y", "x"], (0, "x")),
        ("", [], None),
    ],
)
def test_find_stop(text: str, stops: list, expected) -> None:
    assert find_stop(text, stops) == expected


@pytest.mark.parametrize(
    ("text", "opened", "split"),
    [
        ("plan</think>\n\nanswer", None, ("plan", "answer")),  # unknown prompt: vLLM's guess
        ("plan</think>\n\nanswer", False, (None, "plan</think>\n\nanswer")),  # nothing opened it: text
        ("plan</think>\n\nanswer", True, ("plan", "answer")),
        ("\nstill thinking\n", True, ("still thinking", "")),  # cut off while thinking
        ("\n<think>\nplan\n</think>\nanswer", False, ("plan", "answer")),
        ("answer", True, ("answer", "")),
    ],
)
def test_split_reasoning_knowing_the_prompt(text: str, opened: bool | None, split: tuple) -> None:
    assert split_reasoning(text, opened) == split


def test_thinking_open_reads_the_prompt_tail() -> None:
    assert thinking_open("<|im_start|>assistant\n<think>\n")
    assert not thinking_open("<|im_start|>assistant\n<think>\n\n</think>\n\n") and not thinking_open("hi")
