"""Gemini generateContent / countTokens request -> Chat Completions request (protocols.md §2.3).

The REST API accepts both lowerCamel and snake_case field names, so this does too. Function calls
and responses are paired by the ids the request carries; when a client sends none, ids are derived
from positions, so the same history always renders to the same prompt. Shapes are checked first
against `schemas.gemini`; the checks here are the ones a schema cannot say (which parts a role may
carry, required names, image-only media).
"""

from __future__ import annotations

import json
import re
from typing import Any

from tracetap.capture.adapters.base import AdapterError, RequestContext
from tracetap.capture.adapters.chat_parts import arguments_text
from tracetap.capture.adapters.schemas import validate
from tracetap.capture.adapters.schemas.gemini import GenerateRequest

_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict, "array": list, "string": str, "boolean": bool, "integer": int, "number": (int, float),
}
# Keys that carry no content (signatures, media hints): a part holding only these is skipped.
_PART_METADATA = frozenset({
    "thought", "thoughtSignature", "thought_signature", "partMetadata", "part_metadata",
    "videoMetadata", "video_metadata", "mediaResolution", "media_resolution",
})
_ROLE_PARTS = {
    "user": {"text", "inlineData", "fileData", "functionResponse"},
    "model": {"text", "thought", "functionCall"},
}
_CALLING_MODES = {"AUTO": "auto", "VALIDATED": "auto", "ANY": "required", "NONE": "none"}
_SAMPLING = (
    ("maxOutputTokens", "max_tokens", "integer"),
    ("temperature", "temperature", "number"),
    ("topP", "top_p", "number"),
    ("topK", "top_k", "integer"),
    ("seed", "seed", "integer"),
    ("presencePenalty", "presence_penalty", "number"),
    ("frequencyPenalty", "frequency_penalty", "number"),
    ("stopSequences", "stop", "array"),
)
_SCHEMA_CHILDREN = ("items", "anyOf", "oneOf", "allOf", "additionalProperties", "not")

Part = tuple[str, Any]  # (kind, parsed value: its type follows the kind)


def to_chat_request(body: dict, ctx: RequestContext) -> dict:
    """The chat request sent upstream for a generateContent (or countTokens) body."""
    validate(GenerateRequest, body)
    wrapped = _field(body, "generateContentRequest", "object", "")
    if wrapped is not None and "contents" not in body:  # countTokens' alternative shape
        body = wrapped
    chat: dict = {"model": ctx.served_model, "messages": _system(body) + _messages(body)}
    tools = _tools(body)
    if tools:
        chat["tools"] = tools
        choice = _tool_choice(body)
        if choice is not None:
            chat["tool_choice"] = choice
    chat.update(_generation(_field(body, "generationConfig", "object", "") or {}))
    return chat


# ---- typed field access -----------------------------------------------------------------------

def _typed(value, kind: str, path: str):
    """`value` if it has JSON type `kind` (integral floats pass as integers), else a 400."""
    if value is None:
        return None
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, _JSON_TYPES[kind]) or (isinstance(value, bool) and kind != "boolean"):
        raise AdapterError(f"{path} must be a JSON {kind}")
    return value


def _field(obj: dict, key: str, kind: str, path: str):
    """Field `key` of `obj` under its lowerCamel or snake_case name, type-checked."""
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()
    return _typed(obj.get(key, obj.get(snake)), kind, f"{path}.{key}" if path else key)


def _required(obj: dict, key: str, kind: str, path: str):
    value = _field(obj, key, kind, path)
    if not value:
        raise AdapterError(f"{path}.{key} is required")
    return value


def _object(value, path: str) -> dict:
    if not isinstance(value, dict):
        raise AdapterError(f"{path} must be a JSON object")
    return value


# ---- contents ---------------------------------------------------------------------------------

def _system(body: dict) -> list[dict]:
    value = body.get("systemInstruction", body.get("system_instruction"))
    if value is not None and not isinstance(value, str):
        parts = _parts(_object(value, "systemInstruction"), "systemInstruction")
        if any(kind != "text" for kind, _ in parts):
            raise AdapterError("systemInstruction.parts may hold only text")
        value = "\n".join(text for _, text in parts)
    return [{"role": "system", "content": value}] if value else []


def _messages(body: dict) -> list[dict]:
    contents = _field(body, "contents", "array", "")
    if not contents:
        raise AdapterError("contents is required and must be a non-empty list")
    messages: list[dict] = []
    open_calls: list[tuple[str, str]] = []  # (id, name) of the last model turn's unanswered calls
    for turn, content in enumerate(contents):
        path = f"contents[{turn}]"
        content = _object(content, path)
        role = _field(content, "role", "string", path) or "user"
        role = "user" if role == "function" else role  # old clients answer calls with role `function`
        if role not in _ROLE_PARTS:
            raise AdapterError(f"{path}.role must be 'user' or 'model', not {role!r}")
        parts = _parts(content, path)
        for kind, _ in parts:
            if kind not in _ROLE_PARTS[role]:
                raise AdapterError(f"{path}: a {kind} part is not allowed in a {role} turn")
        if role == "model":
            messages.append(_assistant(parts, turn))
            open_calls = [(c["id"], c["function"]["name"]) for c in messages[-1].get("tool_calls", [])]
        else:
            messages += _user(parts, turn, open_calls)
    return messages


def _parts(content: dict, path: str) -> list[Part]:
    parts = _required(content, "parts", "array", path)
    parsed = [_part(part, f"{path}.parts[{i}]") for i, part in enumerate(parts)]
    return [part for part in parsed if part is not None]


def _part(part, path: str) -> Part | None:
    """(kind, value) of one part; None for a part that only carries metadata."""
    part = _object(part, path)
    text = _field(part, "text", "string", path)
    if text is not None:
        return ("thought" if _field(part, "thought", "boolean", path) else "text"), text
    for kind, parse in _PARSERS.items():
        value = _field(part, kind, "object", path)
        if value is not None:
            return kind, parse(value, f"{path}.{kind}")
    if part and _PART_METADATA.issuperset(part):
        return None
    known = ", ".join(["text", *_PARSERS])
    raise AdapterError(f"{path}: unsupported part with keys {sorted(part)}; a part holds one of {known}")


def _inline_data(value: dict, path: str) -> dict:
    mime = _required(value, "mimeType", "string", path)
    return _image(mime, f"data:{mime};base64,{_required(value, 'data', 'string', path)}", path)


def _file_data(value: dict, path: str) -> dict:
    uri = _required(value, "fileUri", "string", path)
    return _image(_field(value, "mimeType", "string", path) or "image/*", uri, path)


def _image(mime: str, url: str, path: str) -> dict:
    if not mime.startswith("image/"):
        raise AdapterError(f"{path}: only images are supported, not {mime!r}")
    return {"type": "image_url", "image_url": {"url": url}}


def _function_call(value: dict, path: str) -> dict:
    return {
        "id": _field(value, "id", "string", path),
        "name": _required(value, "name", "string", path),
        "args": _field(value, "args", "object", path) or {},
    }


def _function_response(value: dict, path: str) -> dict:
    """Gemini CLI answers with {"output": text} or {"error": text}: that text alone is the result."""
    response = _field(value, "response", "object", path) or {}
    text = response.get("output", response.get("error")) if len(response) == 1 else None
    return {
        "id": _field(value, "id", "string", path),
        "name": _required(value, "name", "string", path),
        "content": text if isinstance(text, str) else json.dumps(response, ensure_ascii=False),
    }


_PARSERS = {
    "inlineData": _inline_data,
    "fileData": _file_data,
    "functionCall": _function_call,
    "functionResponse": _function_response,
}


def _assistant(parts: list[Part], turn: int) -> dict:
    """One model turn. Streamed text arrives split over parts, so pieces join without separators."""
    texts = [value for kind, value in parts if kind == "text"]
    thoughts = [value for kind, value in parts if kind == "thought"]
    calls = [value for kind, value in parts if kind == "functionCall"]
    message: dict = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if thoughts:
        message["reasoning"] = "".join(thoughts)
    if calls:
        message["tool_calls"] = [
            {"id": call["id"] or f"call_{turn}_{k}", "type": "function",
             "function": {"name": call["name"], "arguments": arguments_text(call["args"])}}
            for k, call in enumerate(calls)
        ]
    return message


def _user(parts: list[Part], turn: int, open_calls: list[tuple[str, str]]) -> list[dict]:
    """Tool messages for the function responses first, then one user message with the rest."""
    messages: list[dict] = []
    rest = []
    for kind, value in parts:
        if kind == "functionResponse":
            call_id = _answered(value, open_calls, f"call_{turn}_{len(messages)}")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": value["content"]})
        else:
            rest.append({"type": "text", "text": value} if kind == "text" else value)
    if rest:
        texts = [part["text"] for part in rest if part["type"] == "text"]
        content = "\n".join(texts) if len(texts) == len(rest) else rest  # like vLLM joins text parts
        messages.append({"role": "user", "content": content})
    return messages


def _answered(response: dict, open_calls: list[tuple[str, str]], fallback: str) -> str:
    """The id of the call a response answers: its own id, else the first open call with its name,
    else the first open call; `fallback` when no call is open. Answered calls are closed."""
    if response["id"]:
        open_calls[:] = [call for call in open_calls if call[0] != response["id"]]
        return response["id"]
    named = [call for call in open_calls if call[1] == response["name"]]
    match = next(iter(named or open_calls), None)
    if match is None:
        return fallback
    open_calls.remove(match)
    return match[0]


# ---- tools and generation config --------------------------------------------------------------

def _tools(body: dict) -> list[dict]:
    """Function declarations as chat tools; server-side tools (googleSearch, codeExecution...) drop."""
    tools = []
    for i, tool in enumerate(_field(body, "tools", "array", "") or []):
        path = f"tools[{i}]"
        declarations = _field(_object(tool, path), "functionDeclarations", "array", path) or []
        tools += [_declaration(d, f"{path}.functionDeclarations[{j}]") for j, d in enumerate(declarations)]
    return tools


def _declaration(declaration, path: str) -> dict:
    declaration = _object(declaration, path)
    function = {"name": _required(declaration, "name", "string", path)}
    description = _field(declaration, "description", "string", path)
    if description:
        function["description"] = description
    schema = _field(declaration, "parametersJsonSchema", "object", path)
    if schema is None:
        openapi = _field(declaration, "parameters", "object", path)
        schema = json_schema(openapi) if openapi is not None else {"type": "object", "properties": {}}
    function["parameters"] = schema
    return {"type": "function", "function": function}


def json_schema(schema):
    """Google's OpenAPI schema subset (upper-case types, `nullable`) as plain JSON Schema."""
    if isinstance(schema, list):
        return [json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict = {}
    for key, value in schema.items():
        if key in ("nullable", "propertyOrdering"):
            continue
        if key == "type":
            out[key] = [t.lower() for t in value] if isinstance(value, list) else str(value).lower()
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: json_schema(sub) for name, sub in value.items()}
        else:
            out[key] = json_schema(value) if key in _SCHEMA_CHILDREN else value
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _tool_choice(body: dict) -> str | dict | None:
    config = _field(body, "toolConfig", "object", "") or {}
    calling = _field(config, "functionCallingConfig", "object", "toolConfig") or {}
    path = "toolConfig.functionCallingConfig"
    mode = (_field(calling, "mode", "string", path) or "MODE_UNSPECIFIED").upper()
    if mode == "MODE_UNSPECIFIED":
        return None
    if mode not in _CALLING_MODES:
        raise AdapterError(f"{path}.mode must be one of {', '.join(_CALLING_MODES)}, not {mode!r}")
    names = _field(calling, "allowedFunctionNames", "array", path) or []
    if mode == "ANY" and len(names) == 1:
        name = _typed(names[0], "string", f"{path}.allowedFunctionNames[0]")
        return {"type": "function", "function": {"name": name}}
    return _CALLING_MODES[mode]


def _generation(config: dict) -> dict:
    path = "generationConfig"
    out = {}
    for key, chat_key, kind in _SAMPLING:
        value = _field(config, key, kind, path)
        if value is not None:
            out[chat_key] = value
    for i, stop in enumerate(out.get("stop", [])):
        _typed(stop, "string", f"{path}.stopSequences[{i}]")
    response_format = _response_format(config, path)
    if response_format:
        out["response_format"] = response_format
    thinking = _thinking(_field(config, "thinkingConfig", "object", path) or {}, f"{path}.thinkingConfig")
    if thinking is not None:
        out["chat_template_kwargs"] = {"enable_thinking": thinking}
    return out


def _response_format(config: dict, path: str) -> dict | None:
    if _field(config, "responseMimeType", "string", path) != "application/json":
        return None
    schema = _field(config, "responseJsonSchema", "object", path)
    openapi = _field(config, "responseSchema", "object", path)
    if schema is None and openapi is not None:
        schema = json_schema(openapi)
    if schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}


def _thinking(config: dict, path: str) -> bool | None:
    """A zero budget turns thinking off; asking to see thoughts turns it on; else the model default."""
    if _field(config, "thinkingBudget", "integer", path) == 0:
        return False
    return True if _field(config, "includeThoughts", "boolean", path) else None


def include_thoughts(body: dict) -> bool:
    """Whether the harness asked for thought parts back; only for bodies `to_chat_request` accepted."""
    config = _field(body, "generationConfig", "object", "") or {}
    thinking = _field(config, "thinkingConfig", "object", "generationConfig") or {}
    return _field(thinking, "includeThoughts", "boolean", "generationConfig.thinkingConfig") is True
