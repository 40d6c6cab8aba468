"""Turning generated text into an assistant message: `<think>` reasoning, Hermes `<tool_call>`s, content."""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def tool_call_id() -> str:
    """vLLM's tool-call id format: `chatcmpl-tool-` + 16 hex."""
    return f"chatcmpl-tool-{secrets.token_hex(8)}"


def parse_reply(text: str, parse_tools: bool) -> dict[str, Any]:
    """`{content, reasoning, tool_calls}` for the generated text (tool_calls empty when none parsed)."""
    reasoning, rest = split_reasoning(text)
    content, calls = split_tool_calls(rest) if parse_tools else (rest, [])
    if reasoning is not None and not content:
        content = None  # all thought, no answer (yet)
    return {"content": content, "reasoning": reasoning, "tool_calls": calls}


def split_reasoning(text: str) -> tuple[str | None, str]:
    """Text inside `<think>...</think>` (the opening tag may sit in the prompt) and the text after it."""
    if THINK_END in text:
        head, rest = text.split(THINK_END, 1)
        return head.removeprefix(THINK_START).strip("\n") or None, rest.lstrip("\n")
    if text.lstrip().startswith(THINK_START):  # cut off while still thinking
        return text.lstrip()[len(THINK_START):].strip("\n") or None, ""
    return None, text


def split_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Parse every `<tool_call>{json}</tool_call>`; if any block is malformed, the raw text is the content.

    Arguments are re-serialized with `json.dumps` (as vLLM's hermes parser does); content is the text
    outside the calls, stripped, or None when the reply is only calls.
    """
    calls = []
    for match in TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False)
        function = {"name": call["name"], "arguments": arguments}
        calls.append({"id": tool_call_id(), "type": "function", "function": function})
    if not calls:
        return text, []
    return TOOL_CALL.sub("", text).strip() or None, calls


def find_stop(text: str, stops: list[str]) -> tuple[int, str] | None:
    """The earliest stop string in `text` and where it starts."""
    hits = [(text.find(stop), stop) for stop in stops if stop in text]
    return min(hits) if hits else None
