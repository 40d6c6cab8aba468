"""Sampled token ids -> the assistant message and finish reason a chat endpoint gives for them.

The upstream's `/v1/completions` reports what was sampled (ids, `finish_reason` stop or length, and the
`stop_reason`); this module turns that into vLLM's chat answer for the same tokens: the visible text
(control tokens dropped, a matched stop token or string cut off), then `<think>` reasoning and Hermes
`<tool_call>`s, and a `tool_calls` finish when an auto call was parsed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from tracetap.tokens.parsing import parse_reply


class Decoder(Protocol):
    """Any tokenizer that decodes ids (the engine's ChatTokenizer, a transformers tokenizer)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...


@dataclass(frozen=True)
class ToolUse:
    """How the request asked for tools: parse calls at all, and was one tool named (`tool_choice`)."""

    parse: bool = False
    named: bool = False

    @classmethod
    def of(cls, tools: list[Any] | None, tool_choice: Any) -> ToolUse:
        """vLLM parses calls when tools are offered and not switched off with `tool_choice: none`."""
        return cls(bool(tools) and tool_choice != "none", isinstance(tool_choice, dict))


def visible_text(
    ids: list[int], stop_reason: str | int | None, decoder: Decoder, include_stop: bool = False,
) -> str:
    """The text the ids show: without control tokens, a matched stop token id, or the stop string onward."""
    if isinstance(stop_reason, int) and ids and ids[-1] == stop_reason:
        ids = ids[:-1]
    text = decoder.decode(ids, skip_special_tokens=True)
    if isinstance(stop_reason, str) and stop_reason in text:
        end = text.index(stop_reason) + (len(stop_reason) if include_stop else 0)
        return text[:end]
    return text


def chat_message(
    ids: list[int], finish_reason: str, stop_reason: str | int | None, decoder: Decoder,
    tools: ToolUse = ToolUse(), include_stop: bool = False, opened: bool | None = None,
) -> tuple[dict[str, Any], str]:
    """`({content, reasoning, tool_calls}, finish_reason)`; named calls keep `stop` and a `""` content.
    `opened`: whether the prompt left a `<think>` open (None: unknown, see `split_reasoning`)."""
    message = parse_reply(visible_text(ids, stop_reason, decoder, include_stop), tools.parse, opened)
    if not message["tool_calls"]:
        return message, finish_reason
    if tools.named:
        return {**message, "content": message["content"] or ""}, "stop"
    return message, "tool_calls"
