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


def parse_reply(text: str, parse_tools: bool, opened: bool | None = None) -> dict[str, Any]:
    """`{content, reasoning, tool_calls}` for the generated text (tool_calls empty when none parsed)."""
    reasoning, rest = split_reasoning(text, opened)
    content, calls = split_tool_calls(rest) if parse_tools else (rest, [])
    if reasoning is not None and not content:
        content = None  # all thought, no answer (yet)
    return {"content": content, "reasoning": reasoning, "tool_calls": calls}


def thinking_open(prompt: str) -> bool:
    """Whether the rendered prompt leaves a `<think>` open (the reply then starts in its reasoning)."""
    return prompt.rfind(THINK_START) > prompt.rfind(THINK_END)


def reasoning_start(text: str, opened: bool) -> int | None:
    """Where the reply's reasoning starts: at once when the prompt opened it, after a leading `<think>`."""
    if opened:
        return 0
    body = text.lstrip()
    return len(text) - len(body) + len(THINK_START) if body.startswith(THINK_START) else None


def split_reasoning(text: str, opened: bool | None = None) -> tuple[str | None, str]:
    """Text inside `<think>...</think>` and the text after it.

    `opened` says whether the prompt left a `<think>` open. Unknown (None), the opening tag may sit in the
    prompt, so text before any `</think>` is reasoning (vLLM's guess). Known, reasoning is only what the
    prompt or a leading `<think>` opened, up to `</think>` or the end: a rule a stream can follow without
    taking back text it already sent as content.
    """
    if opened is not None:
        start = reasoning_start(text, opened)
        if start is None:
            return None, text
        head, _, rest = text[start:].partition(THINK_END)
        return head.strip("\n") or None, rest.lstrip("\n")
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
