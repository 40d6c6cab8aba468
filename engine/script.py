"""Scripted mode: a JSONL file of assistant messages, played in order, separately for each session.

One line per reply, in Chat Completions shape:
    {"content": "Looking.", "tool_calls": [{"function": {"name": "Bash", "arguments": {"command": "ls"}}}]}
    {"content": "Done.", "reasoning": "The listing answered it."}
`arguments` may be an object or a JSON string. A session that has used every line keeps getting the last one.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

DEFAULT_SESSION = "default"


class ScriptError(ValueError):
    """The script file is not a list of assistant messages."""


class Script:
    """The replies and, per session, how many of them that session has used."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        if not replies:
            raise ScriptError("a script needs at least one reply")
        self.replies = replies
        self._used: dict[str, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path) -> Script:
        """Read a JSONL script; blank lines are skipped; errors name the line."""
        replies = []
        for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
            if line.strip():
                try:
                    replies.append(_reply(json.loads(line)))
                except (json.JSONDecodeError, ScriptError) as exc:
                    raise ScriptError(f"{path}:{number}: {exc}") from None
        return cls(replies)

    def next_reply(self, session: str | None) -> dict[str, Any]:
        """The session's next reply (the last one again once the script is used up)."""
        session = session or DEFAULT_SESSION
        with self._lock:
            index = self._used.get(session, 0)
            self._used[session] = index + 1
        return self.replies[min(index, len(self.replies) - 1)]


def _reply(line: Any) -> dict[str, Any]:
    """One line as the assistant message the chat template renders."""
    if not isinstance(line, dict):
        raise ScriptError("each line must be a JSON object (an assistant message)")
    content, reasoning = line.get("content"), line.get("reasoning") or line.get("reasoning_content")
    if content is not None and not isinstance(content, str):
        raise ScriptError("`content` must be a string or null")
    if reasoning is not None and not isinstance(reasoning, str):
        raise ScriptError("`reasoning` must be a string")
    calls = [_tool_call(call) for call in line.get("tool_calls") or []]
    if "content" not in line and not calls:
        raise ScriptError("a reply needs `content` or `tool_calls`")
    reply: dict[str, Any] = {"content": content}
    if reasoning:
        reply["reasoning"] = reasoning
    if calls:
        reply["tool_calls"] = calls
    return reply


def _tool_call(call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ScriptError("each tool call needs `function: {name, arguments}`")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            raise ScriptError(f"arguments of {function['name']} are not JSON") from None
    if not isinstance(arguments, dict):
        raise ScriptError(f"arguments of {function['name']} must be a JSON object")
    return {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
