"""Anthropic Messages (and count_tokens) request: the fields `anthropic_request` converts.

Content blocks are told apart by `type`; a type the adapter does not convert (server-tool blocks,
`redacted_thinking`, ...) only has to carry a string `type`: the adapter drops or rejects it by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, Field
from tracetap.capture.adapters.schemas.base import Lenient, by_type

JsonObject = dict[str, Any]


class TextBlock(Lenient):
    text: str


class Source(Lenient):
    """Image and document sources: base64 / url / text / content (the adapter picks by `type`)."""

    type: str | None = None
    media_type: str | None = None
    data: str | None = None
    url: str | None = None
    content: str | list[JsonObject] | None = None


class ImageBlock(Lenient):
    source: Source


class DocumentBlock(Lenient):
    source: Source


class SearchResultBlock(Lenient):
    content: list[JsonObject]


class ToolUseBlock(Lenient):
    id: str
    name: str
    input: JsonObject


class ThinkingBlock(Lenient):
    thinking: str


_USER_SIDE: dict[str, type[BaseModel]] = {"text": TextBlock, "image": ImageBlock, "document": DocumentBlock,
                                           "search_result": SearchResultBlock}
# unions built by `by_type` when the module loads: mypy cannot read them as types (they check as Any)
ResultPart: TypeAlias = by_type(_USER_SIDE)  # type: ignore[valid-type]


class ToolResultBlock(Lenient):
    tool_use_id: str
    content: str | list[ResultPart] | None = None
    is_error: bool | None = None


Block: TypeAlias = by_type({  # type: ignore[valid-type]
    **_USER_SIDE, "tool_result": ToolResultBlock, "tool_use": ToolUseBlock, "thinking": ThinkingBlock})


class Message(Lenient):
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class Tool(Lenient):
    type: str | None = None
    name: str | None = None
    description: str | None = None
    input_schema: JsonObject | None = None


class ToolChoice(Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(Lenient):
    type: Literal["enabled", "adaptive", "between_tools", "disabled"]
    budget_tokens: int | None = None


class OutputFormat(Lenient):
    """Structured output (Claude Code's title call): a JSON schema the answer must follow."""

    type: Literal["json_schema"]
    json_schema: JsonObject = Field(alias="schema")
    name: str | None = None


class OutputConfig(Lenient):
    effort: str | None = None
    format: OutputFormat | None = None


class MessagesRequest(Lenient):
    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[Block] | None = None
    max_tokens: int | None = None  # required for /v1/messages, absent for count_tokens: the adapter checks
    stream: bool | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
