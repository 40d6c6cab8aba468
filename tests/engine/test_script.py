"""Scripted mode: loading JSONL replies and serving them in order per session."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import httpx
import pytest
from tracetap.engine.script import Script, ScriptError
from tracetap.engine.server import EngineServer


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "script.jsonl"
    path.write_text(text)
    return path


def test_load_normalizes_tool_calls(tmp_path: Path) -> None:
    call = {"function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
    lines = [
        {"content": None, "tool_calls": [call]},
        {"role": "assistant", "content": "done", "reasoning_content": "why"},
    ]
    script = Script.load(write(tmp_path, f"{json.dumps(lines[0])}\n\n{json.dumps(lines[1])}\n"))
    first, second = script.replies
    assert first == {"content": None, "tool_calls": [
        {"type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}
    ]}
    assert second == {"content": "done", "reasoning": "why"}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "at least one reply"),
        ("not json\n", ":1:"),
        ('{"content": "a"}\n[1]\n', ":2: each line must be a JSON object"),
        ('{"reasoning": "only"}\n', "needs `content` or `tool_calls`"),
        ('{"content": 3}\n', "`content` must be a string"),
        ('{"tool_calls": [{"name": "Bash"}]}\n', "needs `function"),
        ('{"tool_calls": [{"function": {"name": "Bash", "arguments": "{oops"}}]}\n', "not JSON"),
        ('{"tool_calls": [{"function": {"name": "Bash", "arguments": [1]}}]}\n', "must be a JSON object"),
    ],
)
def test_load_rejects_bad_lines(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ScriptError, match=problem.replace("(", r"\(").replace("[", r"\[")):
        Script.load(write(tmp_path, text))


def test_sessions_advance_independently_and_repeat_the_last() -> None:
    script = Script([{"content": "one"}, {"content": "two"}])
    assert [script.next_reply("a")["content"] for _ in range(3)] == ["one", "two", "two"]
    assert script.next_reply("b")["content"] == "one"
    assert script.next_reply(None)["content"] == "one"
    assert script.next_reply("default")["content"] == "two"  # no header means the session "default"


def test_concurrent_requests_each_get_their_own_line() -> None:
    script = Script([{"content": str(i)} for i in range(50)])
    got: list[str] = []
    def take() -> None:
        got.append(script.next_reply("s")["content"])

    threads = [threading.Thread(target=take) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(got, key=int) == [str(i) for i in range(50)]


TOOL_LINE = {"when": {"has_tools": True}, "content": None,
             "tool_calls": [{"function": {"name": "bash", "arguments": {"command": "ls"}}}]}
CONDITIONED = [
    {"when": {"has_tools": False}, "content": "a title"},
    TOOL_LINE,
    {"when": {"has_tools": True}, "content": "done"},
]


def load(tmp_path: Path, lines: list[dict]) -> Script:
    return Script.load(write(tmp_path, "".join(json.dumps(line) + "\n" for line in lines)))


def take(script: Script, session: str, has_tools: bool) -> str:
    reply = script.next_reply(session, has_tools=has_tools)
    return "call" if reply.get("tool_calls") else reply["content"]


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        # (has_tools of each request, in arrival order) -> the lines they get
        ([False, True, True], ["a title", "call", "done"]),
        ([True, False, True], ["call", "a title", "done"]),
        ([True, True, False, False], ["call", "done", "a title", "a title"]),
        ([True, True, True, False], ["call", "done", "done", "a title"]),
    ],
)
def test_conditions_keep_side_calls_off_the_main_lines(tmp_path: Path, order, expected) -> None:
    script = load(tmp_path, CONDITIONED)
    assert [take(script, "s", has_tools) for has_tools in order] == expected


def test_unconditioned_lines_match_every_request(tmp_path: Path) -> None:
    script = load(tmp_path, [{"when": {"has_tools": False}, "content": "title"}, {"content": "any"}])
    assert [take(script, "s", h) for h in (True, False, False)] == ["any", "title", "any"]
    assert script.conditions == [{"has_tools": False}, {}]


def test_no_matching_line_is_none(tmp_path: Path) -> None:
    script = load(tmp_path, [TOOL_LINE])
    assert script.next_reply("s", has_tools=False) is None
    assert take(script, "s", True) == "call"


@pytest.mark.parametrize(
    ("when", "problem"),
    [
        ([1], "`when` must be a JSON object"),
        ({"has_tool": True}, "unknown condition 'has_tool'"),
        ({"has_tools": "yes"}, "`when.has_tools` must be a bool"),
    ],
)
def test_load_rejects_bad_conditions(tmp_path: Path, when, problem: str) -> None:
    with pytest.raises(ScriptError, match=f":1: {re.escape(problem)}"):
        load(tmp_path, [{"when": when, "content": "x"}])


def test_engine_serves_conditions_over_http(tmp_path: Path) -> None:
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    path = write(tmp_path, "".join(json.dumps(line) + "\n" for line in CONDITIONED[1:]))
    with EngineServer(script=path) as server:
        def ask(**body) -> httpx.Response:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
            return httpx.post(f"{server.url}/v1/chat/completions", json=body,
                              headers={"x-tracetap-session": "h"}, timeout=60)

        untooled = ask()
        assert untooled.status_code == 400
        assert "No script line matches" in untooled.json()["error"]["message"]
        assert ask(tools=tools, tool_choice="none").status_code == 400  # tools switched off count as none
        message = ask(tools=tools).json()["choices"][0]["message"]
        assert message["tool_calls"][0]["function"]["name"] == "bash"
        assert ask(tools=tools).json()["choices"][0]["message"]["content"] == "done"
