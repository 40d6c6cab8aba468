"""OpenAI Chat Completions request: the fields the gateway reads or the upstream must get right."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field
from tracetap.capture.adapters.schemas.base import Lenient

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]
JsonObject = dict[str, Any]


class FunctionName(Lenient):
    name: str


class ToolCall(Lenient):
    function: FunctionName


class Message(Lenient):
    role: Role
    content: str | list[JsonObject] | None = None
    tool_calls: list[ToolCall] | None = None
    name: str | None = None
    tool_call_id: str | None = None


class StreamOptions(Lenient):
    include_usage: bool | None = None


class ChatRequest(Lenient):
    messages: Annotated[list[Message], Field(min_length=1)]
    model: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    stop: str | list[str] | None = None
    tools: list[JsonObject] | None = None
    tool_choice: str | JsonObject | None = None
    parallel_tool_calls: bool | None = None
    response_format: JsonObject | None = None
    chat_template_kwargs: JsonObject | None = None
