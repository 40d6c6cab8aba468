"""Scripted mode: a JSONL file of assistant messages, played in order, separately for each session.

One line per reply, in Chat Completions shape:
    {"content": "Looking.", "tool_calls": [{"function": {"name": "Bash", "arguments": {"command": "ls"}}}]}
    {"content": "Done.", "reasoning": "The listing answered it."}
`arguments` may be an object or a JSON string. A session that has used every line keeps getting the last one.
`"tokens": "split"` samples the line as non-canonical ids (engine/pieces.py), as real models sometimes do.

A line may carry a condition, `"when": {"has_tools": false}`: only requests that match it can use it. Each
request takes its session's first unused line that it matches (the last matching line again once all are
used), so side calls of a real harness (titles, checks, sent without tools) do not eat the tool-calling
lines of its main loop, whichever order they arrive in. Lines without `when` match every request.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

DEFAULT_SESSION = "default"
CONDITIONS = {"has_tools": bool}  # condition name -> the type of its value
TOKENS = ("canonical", "split")  # how a line is sampled: the template's own ids, or every token in pieces


class ScriptError(ValueError):
    """The script file is not a list of assistant messages."""


class Script:
    """The replies and, per session, how many of them that session has used."""

    def __init__(self, replies: list[dict[str, Any]], conditions: list[dict[str, Any]] | None = None) -> None:
        if not replies:
            raise ScriptError("a script needs at least one reply")
        self.replies = replies
        self.conditions = conditions or [{} for _ in replies]  # one `when` per reply; {} matches all
        self._used: dict[str, set[int]] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path) -> Script:
        """Read a JSONL script; blank lines are skipped; errors name the line."""
        replies, conditions = [], []
        for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
            if line.strip():
                try:
                    data = json.loads(line)
                    replies.append(_reply(data))
                    conditions.append(_condition(data.get("when")))
                except (json.JSONDecodeError, ScriptError) as exc:
                    raise ScriptError(f"{path}:{number}: {exc}") from None
        return cls(replies, conditions)

    def next_reply(self, session: str | None, has_tools: bool = False) -> dict[str, Any] | None:
        """The session's first unused line this request matches (the last match again once all are
        used); None when no line matches it."""
        facts = {"has_tools": has_tools}
        matching = [i for i, when in enumerate(self.conditions)
                    if all(facts[name] == value for name, value in when.items())]
        if not matching:
            return None
        with self._lock:
            used = self._used.setdefault(session or DEFAULT_SESSION, set())
            index = next((i for i in matching if i not in used), matching[-1])
            used.add(index)
        return self.replies[index]


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
    tokens = line.get("tokens", "canonical")
    if tokens not in TOKENS:
        raise ScriptError(f"`tokens` must be one of {', '.join(TOKENS)}")
    return reply | ({"tokens": tokens} if tokens != "canonical" else {})


def _condition(when: Any) -> dict[str, Any]:
    """A line's `when`: an object of known conditions with values of the right type."""
    if when is None:
        return {}
    if not isinstance(when, dict):
        raise ScriptError("`when` must be a JSON object")
    for name, value in when.items():
        if name not in CONDITIONS:
            raise ScriptError(f"unknown condition {name!r} in `when` (known: {', '.join(CONDITIONS)})")
        if not isinstance(value, CONDITIONS[name]):
            raise ScriptError(f"`when.{name}` must be a {CONDITIONS[name].__name__}")
    return dict(when)


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
