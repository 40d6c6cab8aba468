"""OpenAI Responses request (Codex): the fields `openai_responses` converts or echoes back.

Input items and content parts are told apart by `type` (an item with a `role` and no `type` is a
message); types the adapter does not convert only need a string `type`, and are dropped (hosted
tools) or rejected by name there.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

from pydantic import Field
from tracetap.capture.adapters.schemas.base import Lenient, by_type

JsonObject = dict[str, Any]


class TextPart(Lenient):
    text: str


class RefusalPart(Lenient):
    refusal: str


class ImagePart(Lenient):
    image_url: str | None = None
    detail: str | None = None


# unions built by `by_type` when the module loads: mypy cannot read them as types (they check as Any)
Part: TypeAlias = by_type(  # type: ignore[valid-type]
    {"input_text": TextPart, "output_text": TextPart, "refusal": RefusalPart, "input_image": ImagePart})


class MessageItem(Lenient):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]


class ReasoningItem(Lenient):
    encrypted_content: str | None = None
    content: list[Any] | None = None
    summary: list[Any] | None = None


class FunctionCallItem(Lenient):
    call_id: str
    name: str
    arguments: str


class CustomCallItem(Lenient):
    call_id: str
    name: str
    input: str


class ShellCallItem(Lenient):
    call_id: str
    action: JsonObject


class OutputItem(Lenient):
    call_id: str | None = None
    id: str | None = None
    output: str | list[Part]


class ShellOutputItem(Lenient):
    call_id: str | None = None
    output: str | list[Any]


Item: TypeAlias = by_type({  # type: ignore[valid-type]
    "message": MessageItem, "reasoning": ReasoningItem, "function_call": FunctionCallItem,
    "custom_tool_call": CustomCallItem, "local_shell_call": ShellCallItem, "shell_call": ShellCallItem,
    "function_call_output": OutputItem, "custom_tool_call_output": OutputItem,
    "local_shell_call_output": OutputItem, "shell_call_output": ShellOutputItem,
}, role_default="message")


class FunctionSpec(Lenient):
    name: str | None = None
    description: str | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None


class Tool(FunctionSpec):
    type: str
    function: FunctionSpec | None = None


class ToolChoice(Lenient):
    type: str
    name: str | None = None
    mode: str | None = None


class TextFormat(Lenient):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    json_schema: JsonObject | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(Lenient):
    format: TextFormat | None = None


class Reasoning(Lenient):
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(Lenient):
    model: str | None = None
    instructions: str | None = None
    input: str | list[Item]
    stream: bool | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    metadata: JsonObject | None = None
