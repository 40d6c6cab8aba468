"""Anthropic Messages / count_tokens request -> Chat Completions request (protocols.md §2.1).

Pure functions, no I/O. The same history always renders the same way, so each prompt extends the
previous one: the per-request billing line is stripped from system text, thinking is kept as the
assistant's `reasoning`, and tool_use inputs go back upstream as the arguments the model produced.
Shapes are checked first against `schemas.anthropic`; the checks here are the ones a schema cannot
say (which block types a role may carry, names that must match).
"""

from __future__ import annotations

import re

from tracetap.capture.adapters.base import AdapterError, RequestContext
from tracetap.capture.adapters.chat_parts import arguments_text
from tracetap.capture.adapters.schemas import validate
from tracetap.capture.adapters.schemas.anthropic import MessagesRequest

# Claude Code puts a per-request hash (`cch=`) in this system line; left in, no two prompts share a prefix.
_BILLING_LINE = re.compile(r"^[ \t]*x-anthropic-billing-header:[^\n]*(?:\n|$)", re.IGNORECASE | re.MULTILINE)
_SERVER_BLOCKS = frozenset({"server_tool_use", "mcp_tool_use", "mcp_tool_result", "container_upload"})
_USER_PARTS = frozenset({"text", "image", "document", "search_result"})
_TOOL_RESULT_PARTS = _USER_PARTS | {"tool_reference", "browser_state"}
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_THINKING = {"enabled": True, "adaptive": True, "between_tools": True, "disabled": False}


def to_chat_request(body: dict, ctx: RequestContext) -> dict:
    """The chat request for a Messages (or count_tokens) body; raises AdapterError on bad input."""
    validate(MessagesRequest, body)
    chat: dict = {"model": ctx.served_model, "messages": _system(body.get("system"), "system")}
    chat["messages"] += _messages(body["messages"])
    max_tokens = _typed(body, "max_tokens", int, "an integer", required=not _is_count_tokens(ctx))
    if max_tokens is not None:
        if max_tokens < 1:
            raise AdapterError("max_tokens: must be at least 1")
        chat["max_tokens"] = max_tokens
    chat.update(_tool_fields(body))
    chat.update(_sampling_fields(body))
    if body.get("thinking") is not None:
        chat["chat_template_kwargs"] = {"enable_thinking": _THINKING[body["thinking"]["type"]]}
    if (response_format := _response_format(body.get("output_config"))) is not None:
        chat["response_format"] = response_format
    return chat


def _is_count_tokens(ctx: RequestContext) -> bool:
    """count_tokens bodies carry no `max_tokens`; everything else converts the same way."""
    return ctx.path.split("?", 1)[0].rstrip("/").endswith("/count_tokens")


def _json_type(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _typed(obj: dict, key: str, kind: type | tuple, what: str, path: str = "", required: bool = False):
    """obj[key] checked against `kind` (bools are never numbers); None when absent and optional."""
    where = f"{path}.{key}" if path else key
    value = obj.get(key)
    if value is None:
        if required:
            raise AdapterError(f"{where}: field required")
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise AdapterError(f"{where}: expected {what}, got {_json_type(value)}")
    return value


def _system(system: object, where: str) -> list[dict]:
    """Top-level `system` (or a `system` role message) as at most one chat system message."""
    if system is None:
        return []
    blocks = [{"type": "text", "text": system}] if isinstance(system, str) else system
    if not isinstance(blocks, list):
        raise AdapterError(f"{where}: expected a string or an array of text blocks")
    texts = []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise AdapterError(f"{where}.{i}: system content must be text blocks")
        text = _BILLING_LINE.sub("", _typed(block, "text", str, "a string", f"{where}.{i}", True))
        if text.strip():
            texts.append(text)
    return [{"role": "system", "content": "\n\n".join(texts)}] if texts else []


def _messages(messages: list) -> list[dict]:
    out: list[dict] = []
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            raise AdapterError(f"{where}: expected an object with `role` and `content`")
        role = message.get("role")
        if role == "system":
            out += _system(message.get("content"), f"{where}.content")
        elif role == "user":
            out += _user_messages(_blocks(message, where))
        elif role == "assistant":
            out.append(_assistant_message(_blocks(message, where)))
        else:
            raise AdapterError(f"{where}.role: expected 'user' or 'assistant', got {role!r}")
    return out


def _blocks(message: dict, where: str) -> list[tuple[str, dict]]:
    """(path, block) pairs of a message's content, minus blocks of Anthropic-hosted server tools."""
    content = message.get("content")
    if isinstance(content, str):
        return [(f"{where}.content", {"type": "text", "text": content})]
    if not isinstance(content, list):
        raise AdapterError(f"{where}.content: expected a string or an array of content blocks")
    pairs = []
    for i, block in enumerate(content):
        path = f"{where}.content.{i}"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise AdapterError(f"{path}: expected a content block object with a string `type`")
        if not _is_server_block(block["type"]):
            pairs.append((path, block))
    return pairs


def _is_server_block(kind: str) -> bool:
    """Blocks of Anthropic-hosted tools (web search, code execution, ...): the upstream has no such tools."""
    return kind in _SERVER_BLOCKS or (kind.endswith("_tool_result") and kind != "tool_result")


def _unsupported(kind: str, role: str, path: str) -> AdapterError:
    return AdapterError(f"{path}: content block type {kind!r} is not supported in a {role} message")


def _user_messages(blocks: list[tuple[str, dict]]) -> list[dict]:
    """Tool results first (chat wants them right after the assistant's calls), then one user message."""
    tool_messages, parts = [], []
    tool_images: list[dict] = []
    for path, block in blocks:
        if block["type"] == "tool_result":
            message, images = _tool_result(block, path)
            tool_messages.append(message)
            tool_images += images
        elif block["type"] in _USER_PARTS:
            parts += _parts(block, path)
        else:
            raise _unsupported(block["type"], "user", path)
    # Tool messages are text-only in most templates: their images ride in the following user turn.
    rest = tool_images + parts
    if rest or not tool_messages:
        return [*tool_messages, {"role": "user", "content": _collapse(rest)}]
    return tool_messages


def _collapse(parts: list[dict]) -> str | list[dict]:
    """Text-only content becomes one string (joined like vLLM joins text parts); images keep parts."""
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _parts(block: dict, path: str) -> list[dict]:
    """Chat content parts for one user-side block (documents and search results flatten to text)."""
    kind = block["type"]
    if kind == "text":
        return [{"type": "text", "text": _typed(block, "text", str, "a string", path, True)}]
    if kind == "image":
        return [{"type": "image_url", "image_url": {"url": _image_url(block, path)}}]
    if kind == "document":
        return [{"type": "text", "text": text} for text in _document_texts(block, path)]
    if kind == "search_result":
        content = _typed(block, "content", list, "an array of text blocks", path, True)
        return [{"type": "text", "text": text} for text in _texts_of(content, f"{path}.content")]
    return []  # tool_reference, browser_state: nothing the model can read


def _image_url(block: dict, path: str) -> str:
    source = _typed(block, "source", dict, "an object", path, True)
    where = f"{path}.source"
    if source.get("type") == "base64":
        media_type = _typed(source, "media_type", str, "a string", where, True)
        return f"data:{media_type};base64,{_typed(source, 'data', str, 'a string', where, True)}"
    if source.get("type") == "url":
        return _typed(source, "url", str, "a string", where, True)
    kind = source.get("type")
    raise AdapterError(f"{where}.type: unsupported image source {kind!r} (use 'base64' or 'url')")


def _document_texts(block: dict, path: str) -> list[str]:
    """Plain-text and content documents give their text; PDFs, URLs and files give nothing."""
    source = _typed(block, "source", dict, "an object", path, True)
    where = f"{path}.source"
    if source.get("type") == "text":
        return [_typed(source, "data", str, "a string", where, True)]
    if source.get("type") == "content":
        content = _typed(source, "content", (str, list), "a string or an array", where, True)
        return [content] if isinstance(content, str) else _texts_of(content, f"{where}.content")
    return []


def _texts_of(blocks: list, where: str) -> list[str]:
    """The text of the text blocks in a nested list (other block types carry no text)."""
    texts = []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict):
            raise AdapterError(f"{where}.{i}: expected a content block object")
        if block.get("type") == "text":
            texts.append(_typed(block, "text", str, "a string", f"{where}.{i}", True))
    return texts


def _tool_result(block: dict, path: str) -> tuple[dict, list[dict]]:
    """One chat `tool` message (text only, errors marked) and the result's image parts."""
    call_id = _typed(block, "tool_use_id", str, "a string", path, True)
    content = _typed(block, "content", (str, list), "a string or an array of content blocks", path)
    items = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
    parts: list[dict] = []
    for i, item in enumerate(items):
        item_path = f"{path}.content.{i}"
        if not isinstance(item, dict) or item.get("type") not in _TOOL_RESULT_PARTS:
            kind = item.get("type") if isinstance(item, dict) else _json_type(item)
            raise AdapterError(f"{item_path}: content block type {kind!r} is not supported in a tool_result")
        parts += _parts(item, item_path)
    text = "\n".join(part["text"] for part in parts if part["type"] == "text")
    if _typed(block, "is_error", bool, "a boolean", path):
        text = f"Error: {text}" if text else "Error"
    images = [part for part in parts if part["type"] == "image_url"]
    return {"role": "tool", "tool_call_id": call_id, "content": text}, images


def _assistant_message(blocks: list[tuple[str, dict]]) -> dict:
    """Text, reasoning (vLLM's `reasoning` field) and tool calls of one assistant turn."""
    texts, reasoning, calls = [], [], []
    for path, block in blocks:
        kind = block["type"]
        if kind == "text":
            texts.append(_typed(block, "text", str, "a string", path, True))
        elif kind == "thinking":
            reasoning.append(_typed(block, "thinking", str, "a string", path, True))
        elif kind == "tool_use":
            calls.append(_tool_call(block, path))
        elif kind != "redacted_thinking":  # opaque provider data: nothing to give the model
            raise _unsupported(kind, "assistant", path)
    message: dict = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if reasoning:
        message["reasoning"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_call(block: dict, path: str) -> dict:
    arguments = _typed(block, "input", dict, "an object", path, True)
    return {
        "id": _typed(block, "id", str, "a string", path, True),
        "type": "function",
        "function": {"name": _typed(block, "name", str, "a string", path, True),
                     "arguments": arguments_text(arguments)},
    }


def _tool_fields(body: dict) -> dict:
    """`tools` (custom tools only) and the mapped `tool_choice`, omitted when no tool remains."""
    functions = []
    for i, tool in enumerate(body.get("tools") or []):
        if tool.get("type") in (None, "custom"):  # any other type is an Anthropic server tool
            functions.append(_function(tool, f"tools.{i}"))
    choice = _tool_choice(body.get("tool_choice"))
    if not functions:
        return {}
    fields: dict = {"tools": functions, **choice}
    named = choice.get("tool_choice")
    name = named["function"]["name"] if isinstance(named, dict) else None
    if name is not None and name not in {function["function"]["name"] for function in functions}:
        raise AdapterError(f"tool_choice.name: no tool named {name!r} in tools")
    return fields


def _function(tool: dict, path: str) -> dict:
    function = {"name": _typed(tool, "name", str, "a string", path, True)}
    description = _typed(tool, "description", str, "a string", path)
    if description is not None:
        function["description"] = description
    function["parameters"] = _typed(tool, "input_schema", dict, "a JSON schema object", path, True)
    return {"type": "function", "function": function}


def _tool_choice(choice: dict | None) -> dict:
    if choice is None:
        return {}
    if choice["type"] == "tool":
        name = _typed(choice, "name", str, "a string", "tool_choice", True)
        fields: dict = {"tool_choice": {"type": "function", "function": {"name": name}}}
    else:
        fields = {"tool_choice": _TOOL_CHOICES[choice["type"]]}
    if choice.get("disable_parallel_tool_use"):
        fields["parallel_tool_calls"] = False
    return fields


def _sampling_fields(body: dict) -> dict:
    fields = {key: body[key] for key in ("temperature", "top_p", "top_k") if body.get(key) is not None}
    if body.get("stop_sequences"):
        fields["stop"] = body["stop_sequences"]
    return fields


def _response_format(config: dict | None) -> dict | None:
    """`output_config.format` (a JSON schema the answer must follow) as Chat's `response_format`."""
    fmt = (config or {}).get("format")
    if fmt is None:
        return None
    return {"type": "json_schema", "json_schema": {"name": fmt.get("name") or "output", "schema": fmt["schema"]}}
