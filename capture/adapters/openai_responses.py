"""OpenAI Responses API (`POST /v1/responses`, used by Codex) <-> Chat Completions.

Request (protocols.md §2.2):
- `instructions` -> leading system message; a string `input` -> one user message.
- `input` items, folded so each model turn is one assistant message: `message` (developer -> system;
  text parts joined with "\\n", `input_image` -> `image_url`), `reasoning` -> `reasoning` of the next
  assistant message (text from our own `encrypted_content`, else `content`, else `summary`; foreign
  encrypted content is dropped), `function_call` / `custom_tool_call` / `local_shell_call` / `shell_call`
  -> `tool_calls` of the current assistant message (a call after tool outputs starts a new one),
  `*_output` items -> `tool` messages (images in tool outputs follow as one user message). Items of
  OpenAI-hosted tools (web_search_call, ...) are dropped; unknown items are a 400.
- tools: flat `function` -> nested chat function; `custom` (Codex freeform) -> function taking
  `{"input": str}`; `local_shell` / `shell` -> function `shell` (schemas in `openai_responses_output`);
  every other (hosted) tool type is dropped, and `tool_choice` is only sent when tools remain.
- `max_output_tokens` -> `max_tokens`; `temperature`, `top_p`, `parallel_tool_calls` copied; `text.format`
  json_schema / json_object -> `response_format`; `reasoning.effort` none|minimal -> enable_thinking false,
  any other effort -> true. `store`, `metadata`, `include`, `prompt_cache_key`, ... are ignored.
- Stateless: `previous_response_id` and `conversation` are a 400.

Shapes are checked first against `schemas.openai_responses`; the checks here are the ones a schema
cannot say (which items may follow which, names that must be declared).

Responses and streams are built in `openai_responses_output`; they read the harness's body from
`ctx.extra["request"]` to echo it and to render shell and custom tool calls as their own item types.
"""

from __future__ import annotations

import json
from typing import Any

from tracetap.capture.adapters import openai_chat
from tracetap.capture.adapters.base import AdapterError, RequestContext
from tracetap.capture.adapters.openai_responses_output import (
    CONTEXT_OVERFLOW,
    SHELL_KINDS,
    SHELL_TOOL_NAME,
    from_chat_response,
    is_overflow,
    open_reasoning,
    shell_action,
    shell_arguments,
    shell_tool,
    to_sse_events,
    translator,
)
from tracetap.capture.adapters.schemas import validate
from tracetap.capture.adapters.schemas.openai_responses import ResponsesRequest

__all__ = ["to_chat_request", "from_chat_response", "to_sse_events", "error_body", "error_events",
           "count_tokens_body", "translator"]

_HOSTED_CALLS = frozenset({
    "web_search_call", "file_search_call", "computer_call", "computer_call_output", "code_interpreter_call",
    "image_generation_call", "mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response",
    "tool_search_call", "tool_search_output",
})
_CALLS = ("function_call", "custom_tool_call", "local_shell_call", "shell_call")
_OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output", "shell_call_output")
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_DETAILS = ("auto", "low", "high")
_NO_THINKING = ("none", "minimal")
_CUSTOM_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", dict: "an object"}


def to_chat_request(body: dict, ctx: RequestContext) -> dict:
    """The chat request for a Responses request; raises AdapterError on bad input."""
    validate(ResponsesRequest, body)
    for key in ("previous_response_id", "conversation"):
        if body.get(key) is not None:
            raise AdapterError(f"`{key}` is not supported: this gateway is stateless and stores no responses;"
                               " send the whole conversation in `input` (as Codex does with store=false)")
    chat: dict = {"model": ctx.served_model, "messages": _messages(body)}
    tools = _chat_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(body["tool_choice"], {t["function"]["name"] for t in tools})
        if body.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = _typed(body, "parallel_tool_calls", bool)
    chat.update(_sampling(body))
    return chat


def error_body(status: int, message: str, kind: str = "invalid_request") -> dict:
    """OpenAI's error envelope (shared with Chat); context overflows get `context_length_exceeded`."""
    body = openai_chat.error_body(status, message, kind)
    if is_overflow(status, message):
        body["error"].update(type="invalid_request_error", param="input", code=CONTEXT_OVERFLOW)
    return body


def error_events(status: int, message: str, kind: str, ctx: RequestContext) -> list[bytes]:
    """A failure answered as a stream: `response.created`, then `response.failed` with `error.code`.

    Codex reads the code: `context_length_exceeded` is final, any other is retried.
    """
    return translator(ctx).error(status, message, kind)


def count_tokens_body(n: int) -> dict:
    """Answer of `POST /v1/responses/input_tokens`."""
    return {"object": "response.input_tokens", "input_tokens": n}


def _messages(body: dict) -> list[dict]:
    instructions = _typed(body, "instructions", str)
    messages = [{"role": "system", "content": instructions}] if instructions else []
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise AdapterError("`input` is required: a string or a list of input items")
    messages += _Transcript().convert(items)
    if not messages:
        raise AdapterError("`input` holds no message")
    return messages


class _Transcript:
    """Folds input items into chat messages, one assistant message per model turn."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.turn: dict | None = None       # the assistant message still taking tool calls
        self.reasoning: list[str] = []      # reasoning waiting for the next assistant message
        self.images: list[dict] = []        # images from tool outputs, sent after the tool block

    def convert(self, items: list) -> list[dict]:
        for index, item in enumerate(items):
            where = f"input[{index}]"
            if not isinstance(item, dict):
                raise AdapterError(f"{where} must be an object")
            kind = item.get("type") or ("message" if "role" in item else None)
            if kind == "message":
                self._message(item, where)
            elif kind == "reasoning":
                self._reasoning(item)
            elif kind in _CALLS:
                self._call(_tool_call(item, kind, where))
            elif kind in _OUTPUTS:
                self._output(item, kind, where)
            elif kind not in _HOSTED_CALLS:
                raise AdapterError(f"{where}: unsupported input item type {kind!r}")
        self._close_turn()
        return self.messages

    def _message(self, item: dict, where: str) -> None:
        role = _ROLES.get(item.get("role", ""))
        if role is None:
            raise AdapterError(f"{where}.role must be one of {sorted(_ROLES)}")
        content = _content(item.get("content"), role, where)
        if role == "assistant":
            self._close_tools()
            self.turn = self._assistant(content)
        else:
            self._close_turn()
            self.messages.append({"role": role, "content": content})

    def _reasoning(self, item: dict) -> None:
        self._close_tools()
        self.turn = None
        text = _reasoning_text(item)
        if text:
            self.reasoning.append(text)

    def _call(self, call: dict) -> None:
        self._close_tools()
        if self.turn is None:
            self.turn = self._assistant(None)
        self.turn.setdefault("tool_calls", []).append(call)

    def _output(self, item: dict, kind: str, where: str) -> None:
        self.turn = None
        call_id = item.get("call_id") or (item.get("id") if kind == "local_shell_call_output" else None)
        if not isinstance(call_id, str) or not call_id:
            raise AdapterError(f"{where}.call_id is required")
        text, images = _output_content(item.get("output"), kind, where)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        self.images += images

    def _assistant(self, content: str | list[dict] | None) -> dict:
        message: dict = {"role": "assistant", "content": content}
        if self.reasoning:
            message["reasoning"] = "\n\n".join(self.reasoning)
            self.reasoning = []
        self.messages.append(message)
        return message

    def _close_tools(self) -> None:
        """A finished tool block hands its images to the model as the next user message."""
        if self.images:
            self.messages.append({"role": "user", "content": self.images})
            self.images = []

    def _close_turn(self) -> None:
        """Before a message or at the end: reasoning with no answer was a turn of its own."""
        self._close_tools()
        self.turn = None
        if self.reasoning:
            self._assistant("")


def _reasoning_text(item: dict) -> str:
    own = open_reasoning(item.get("encrypted_content"))
    if own is not None:
        return own
    for key in ("content", "summary"):
        parts = item.get(key)
        texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)] \
            if isinstance(parts, list) else []
        if texts:
            return "\n\n".join(texts)
    return ""


def _tool_call(item: dict, kind: str, where: str) -> dict:
    """A call item as a chat tool call; shell and custom calls become calls of their function."""
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise AdapterError(f"{where}.call_id is required")
    if kind == "function_call":
        name, arguments = _typed(item, "name", str, where), _typed(item, "arguments", str, where)
    elif kind == "custom_tool_call":
        name = _typed(item, "name", str, where)
        arguments = json.dumps({"input": _typed(item, "input", str, where)})
    else:
        shell = "local_shell" if kind == "local_shell_call" else "shell"
        action = item.get("action")
        if not isinstance(action, dict):
            raise AdapterError(f"{where}.action must be an object")
        name, arguments = SHELL_TOOL_NAME, shell_arguments(shell, action)
        if shell_action(shell, arguments) is None:
            raise AdapterError(f"{where}.action must list the command(s) as strings")
    if not name:
        raise AdapterError(f"{where}.name is required")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _output_content(output: object, kind: str, where: str) -> tuple[str, list[dict]]:
    """Tool message text, plus the images a tool returned (tool messages are text only)."""
    if isinstance(output, str):
        return output, []
    if kind == "shell_call_output" and isinstance(output, list):
        return json.dumps(output, ensure_ascii=False), []
    if not isinstance(output, list):
        raise AdapterError(f"{where}.output must be a string or a list of parts")
    parts = [_part(p, f"{where}.output[{i}]") for i, p in enumerate(output)]
    text = "\n".join(p["text"] for p in parts if p["type"] == "text")
    return text, [p for p in parts if p["type"] == "image_url"]


def _content(content: object, role: str, where: str) -> str | list[dict]:
    """Message content: text-only parts become one string; images are kept for user messages."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise AdapterError(f"{where}.content must be a string or a list of parts")
    parts = [_part(p, f"{where}.content[{i}]") for i, p in enumerate(content)]
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    if role != "user":
        raise AdapterError(f"{where}: only user messages may carry images")
    return parts


def _part(part: object, where: str) -> dict:
    if not isinstance(part, dict):
        raise AdapterError(f"{where} must be an object")
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": _typed(part, "text", str, where)}
    if kind == "refusal":
        return {"type": "text", "text": _typed(part, "refusal", str, where)}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise AdapterError(f"{where}: input_image needs `image_url` (file_id needs stored files)")
        image = {"url": url, **({"detail": part["detail"]} if part.get("detail") in _DETAILS else {})}
        return {"type": "image_url", "image_url": image}
    raise AdapterError(f"{where}: unsupported content part type {kind!r}")


def _chat_tools(tools: object) -> list[dict]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise AdapterError("`tools` must be a list")
    out: list[dict] = []
    for index, tool in enumerate(tools):
        chat_tool = _chat_tool(tool, f"tools[{index}]")
        if chat_tool is None:
            continue
        if chat_tool["function"]["name"] in {t["function"]["name"] for t in out}:
            raise AdapterError(f"tools[{index}]: the tool name {chat_tool['function']['name']!r} is taken")
        out.append(chat_tool)
    return out


def _chat_tool(tool: object, where: str) -> dict | None:
    """One Responses tool as a chat function tool; None for hosted tools we cannot run."""
    if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
        raise AdapterError(f"{where} must be an object with a `type`")
    kind = tool["type"]
    if kind in SHELL_KINDS:
        return shell_tool(kind)
    if kind not in ("function", "custom"):
        return None
    spec = tool["function"] if isinstance(tool.get("function"), dict) else tool
    function = {"name": _typed(spec, "name", str, where)}
    if not function["name"]:
        raise AdapterError(f"{where}.name is required")
    if spec.get("description") is not None:
        function["description"] = _typed(spec, "description", str, where)
    if kind == "custom":
        return {"type": "function", "function": {**function, "parameters": _CUSTOM_PARAMETERS}}
    function["parameters"] = _typed(spec, "parameters", dict, where) or {"type": "object", "properties": {}}
    if spec.get("strict") is not None:
        function["strict"] = _typed(spec, "strict", bool, where)
    return {"type": "function", "function": function}


def _tool_choice(choice: object, names: set[str]) -> str | dict:
    if isinstance(choice, str) and choice in ("auto", "none", "required"):
        return choice
    if not isinstance(choice, dict):
        raise AdapterError("`tool_choice` must be auto, none, required or an object")
    kind = choice.get("type")
    if kind == "allowed_tools":
        return "required" if choice.get("mode") == "required" else "auto"
    if kind not in ("function", "custom", *SHELL_KINDS):
        return "auto"  # a hosted tool (web_search, file_search, ...) that we dropped
    name = SHELL_TOOL_NAME if kind in SHELL_KINDS else choice.get("name")
    if name not in names:
        raise AdapterError(f"`tool_choice` names a tool that is not declared: {name!r}")
    return {"type": "function", "function": {"name": name}}


def _sampling(body: dict) -> dict:
    out: dict = {}
    max_tokens = _typed(body, "max_output_tokens", int)
    if max_tokens is not None:
        if max_tokens < 1:
            raise AdapterError("`max_output_tokens` must be a positive integer")
        out["max_tokens"] = max_tokens
    for key in ("temperature", "top_p"):
        if _typed(body, key, (int, float)) is not None:
            out[key] = body[key]
    response_format = _response_format(_typed(body, "text", dict) or {})
    if response_format:
        out["response_format"] = response_format
    reasoning = _typed(body, "reasoning", dict) or {}
    if reasoning.get("effort") is not None:
        out["chat_template_kwargs"] = {"enable_thinking": reasoning["effort"] not in _NO_THINKING}
    return out


def _response_format(text: dict) -> dict | None:
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise AdapterError("`text.format.type` must be text, json_object or json_schema")


def _typed(obj: dict, key: str, types: type | tuple, where: str = "") -> Any:
    """obj[key] if it is absent/null or of the given type(s); a 400 naming the field otherwise."""
    value = obj.get(key)
    allowed = types if isinstance(types, tuple) else (types,)
    wrong = isinstance(value, bool) and bool not in allowed or not isinstance(value, types)
    if value is not None and wrong:
        field = f"{where}.{key}" if where else f"`{key}`"
        expected = " or ".join(_TYPE_NAMES[t] for t in allowed)
        raise AdapterError(f"{field} must be {expected}, not {type(value).__name__}")
    return value
