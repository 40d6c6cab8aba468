"""Scripted mode: loading JSONL replies and serving them in order per session."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from engine.script import Script, ScriptError


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
