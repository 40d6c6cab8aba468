"""Gemini generateContent / countTokens request: the fields `gemini_request` converts.

The REST API takes lowerCamel and snake_case names alike, so every field here does too (lowerCamel
first, as the adapter reads them). Integers may arrive as integral floats (`64.0`), as JSON allows.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, AliasChoices, AliasGenerator, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError
from tracetap.capture.adapters.schemas.base import Lenient

JsonObject = dict[str, Any]


def _integer(value: object) -> object:
    """An int, or a float with no fractional part; never a bool."""
    whole = isinstance(value, int) or isinstance(value, float) and value.is_integer()
    if value is not None and (isinstance(value, bool) or not whole):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


Integer = Annotated[Any, AfterValidator(_integer)]


class Camel(Lenient):
    model_config = ConfigDict(alias_generator=AliasGenerator(
        validation_alias=lambda name: AliasChoices(to_camel(name), name)))


class OpenApiSchema(Camel):
    """Google's OpenAPI subset, which the adapter rewrites into JSON Schema node by node."""

    type: str | list[str] | None = None
    nullable: bool | None = None
    properties: dict[str, OpenApiSchema] | None = None
    items: OpenApiSchema | list[OpenApiSchema] | None = None
    any_of: list[OpenApiSchema] | None = None
    one_of: list[OpenApiSchema] | None = None
    all_of: list[OpenApiSchema] | None = None
    additional_properties: bool | OpenApiSchema | None = None
    negated: OpenApiSchema | None = Field(None, validation_alias="not")


class Blob(Camel):
    mime_type: str | None = None
    data: str | None = None


class FileData(Camel):
    mime_type: str | None = None
    file_uri: str | None = None


class FunctionCall(Camel):
    id: str | None = None
    name: str | None = None
    args: JsonObject | None = None


class FunctionResponse(Camel):
    id: str | None = None
    name: str | None = None
    response: JsonObject | None = None


class Part(Camel):
    text: str | None = None
    thought: bool | None = None
    inline_data: Blob | None = None
    file_data: FileData | None = None
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None


class Content(Camel):
    role: str | None = None
    parts: list[Part] | None = None


class FunctionDeclaration(Camel):
    name: str | None = None
    description: str | None = None
    parameters: OpenApiSchema | None = None
    parameters_json_schema: JsonObject | None = None


class Tool(Camel):
    function_declarations: list[FunctionDeclaration] | None = None


class FunctionCallingConfig(Camel):
    mode: str | None = None
    allowed_function_names: list[str] | None = None


class ToolConfig(Camel):
    function_calling_config: FunctionCallingConfig | None = None


class ThinkingConfig(Camel):
    thinking_budget: Integer | None = None
    include_thoughts: bool | None = None
    thinking_level: str | None = None


class GenerationConfig(Camel):
    max_output_tokens: Integer | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Integer | None = None
    seed: Integer | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    candidate_count: Integer | None = None
    stop_sequences: list[str] | None = None
    response_mime_type: str | None = None
    response_json_schema: JsonObject | None = None
    response_schema: OpenApiSchema | None = None
    thinking_config: ThinkingConfig | None = None


class GenerateRequest(Camel):
    contents: list[Content] | None = None  # required, unless countTokens wraps the request (the adapter checks)
    system_instruction: str | Content | None = None
    tools: list[Tool] | None = None
    tool_config: ToolConfig | None = None
    generation_config: GenerationConfig | None = None
    generate_content_request: GenerateRequest | None = None
