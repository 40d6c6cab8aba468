"""Chat Completions response -> OpenAI Responses object and its synthetic SSE stream.

The response side of `openai_responses` (split out to keep each module to one direction). It also holds
the two codecs both directions share, so that what we emit decodes back exactly on the next turn:

- reasoning: `encrypted_content` is `"tracetap:v1:"` + urlsafe base64 of the UTF-8 reasoning text. Not a
  secret: the gateway is the server on both ends and only needs the text back verbatim.
- shell tools: a `local_shell` / `shell` tool is offered upstream as a function named `shell` whose
  arguments are the item's `action` without its constant fields (`{"command": [argv]}` for local_shell,
  `{"commands": [lines]}` for shell); see `shell_tool`, `shell_arguments`, `shell_action`.

Stream order (protocols.md §4.3): `response.created`, `response.in_progress`, then per output item
`output_item.added`, its part/delta/done events, `output_item.done`, and last `response.completed`, also
for truncated turns (status `incomplete`), because Codex and the SDK's `get_final_response()` need it.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable

from tracetap.capture.adapters.base import (
    AdapterError,
    RequestContext,
    first_choice,
    reasoning_text,
    request_body,
    sse_frame,
)
from tracetap.capture.adapters.chat_parts import usage_of
from tracetap.capture.adapters.stream_pieces import ARGUMENTS, CALL, REASONING, PendingCall, Piece, pieces, replayed

SEAL_PREFIX = "tracetap:v1:"
SHELL_TOOL_NAME = "shell"
SHELL_KINDS = ("local_shell", "shell")

_STRINGS = {"type": "array", "items": {"type": "string"}}
_SHELL_PARAMETERS = {
    "local_shell": {
        "type": "object",
        "properties": {
            "command": {**_STRINGS, "description": "The program and its arguments, e.g. [\"ls\", \"-la\"]."},
            "timeout_ms": {"type": "integer", "description": "Optional timeout in milliseconds."},
            "working_directory": {"type": "string", "description": "Optional directory to run in."},
        },
        "required": ["command"],
    },
    "shell": {
        "type": "object",
        "properties": {
            "commands": {**_STRINGS, "description": "Shell command lines to run in order."},
            "timeout_ms": {"type": "integer", "description": "Optional timeout in milliseconds."},
            "max_output_length": {"type": "integer", "description": "Optional cap on captured output."},
        },
        "required": ["commands"],
    },
}
# The action key that carries the command(s), then the optional keys kept in the arguments, in order.
_SHELL_FIELDS = {
    "local_shell": ("command", ("timeout_ms", "working_directory")),
    "shell": ("commands", ("timeout_ms", "max_output_length")),
}
_NOTHING_YET: dict[str, dict] = {  # an item's fields before anything is generated, by its type
    "reasoning": {"summary": [], "encrypted_content": None}, "message": {"content": []},
    "function_call": {"arguments": ""}, "custom_tool_call": {"input": ""}}
_INCOMPLETE: dict[str | None, str] = {"length": "max_output_tokens", "content_filter": "content_filter"}
CONTEXT_OVERFLOW = "context_length_exceeded"
_OVERFLOW = re.compile(r"maximum context length|context window|context length exceeded|prompt is too long",
                       re.IGNORECASE)


def seal_reasoning(text: str) -> str:
    """Deterministic `encrypted_content` for reasoning text (same text, same string)."""
    return SEAL_PREFIX + base64.urlsafe_b64encode(text.encode("utf-8", "surrogatepass")).decode()


def open_reasoning(blob: object) -> str | None:
    """The text inside our own `encrypted_content`; None for anything another server produced."""
    if not isinstance(blob, str) or not blob.startswith(SEAL_PREFIX):
        return None
    try:
        return base64.b64decode(blob[len(SEAL_PREFIX):], altchars=b"-_", validate=True).decode("utf-8", "surrogatepass")
    except ValueError as exc:  # bad base64, non-ASCII text, or bytes that are not UTF-8
        raise AdapterError("reasoning encrypted_content carries our prefix but is corrupted") from exc


def shell_tool(kind: str) -> dict:
    """The chat function offered upstream for a Responses `local_shell` or `shell` tool."""
    return {"type": "function", "function": {
        "name": SHELL_TOOL_NAME,
        "description": "Run shell commands on the user's machine and return their output.",
        "parameters": _SHELL_PARAMETERS[kind],
    }}


def shell_arguments(kind: str, action: dict) -> str:
    """Chat tool-call arguments for a shell item's `action` (inverse of `shell_action`)."""
    key, optional = _SHELL_FIELDS[kind]
    args = {key: action.get(key)}
    args.update({name: action[name] for name in optional if action.get(name) is not None})
    return json.dumps(args)


def shell_action(kind: str, arguments: str) -> dict | None:
    """The item `action` for chat arguments, or None when they are not a valid call of that tool."""
    key, optional = _SHELL_FIELDS[kind]
    try:
        args = json.loads(arguments)
    except (TypeError, ValueError):
        return None
    if not isinstance(args, dict) or not _is_strings(args.get(key)):
        return None
    action = {key: args[key], **{name: args.get(name) for name in optional}}
    return {"type": "exec", "env": {}, "user": None, **action} if kind == "local_shell" else action


def tool_kinds(tools: object) -> dict[str, str]:
    """Chat function name -> Responses tool type (function | custom | local_shell | shell)."""
    kinds: dict[str, str] = {}
    for tool in tools if isinstance(tools, list) else []:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in SHELL_KINDS:
            kinds[SHELL_TOOL_NAME] = kind
        elif kind in ("function", "custom") and isinstance(tool.get("name"), str):
            kinds[tool["name"]] = kind
    return kinds


def from_chat_response(chat: dict, ctx: RequestContext) -> dict:
    """The complete Responses object for one upstream chat completion."""
    choice = first_choice(chat)
    reason = _INCOMPLETE.get(choice.get("finish_reason"))
    response = _envelope(ctx, "incomplete" if reason else "completed")
    response["incomplete_details"] = {"reason": reason} if reason else None
    response["output"] = _output(choice.get("message") or {}, ctx)
    response["usage"] = _usage(chat)
    return response


def to_sse_events(chat: dict, ctx: RequestContext) -> list[bytes]:
    """The Responses event stream that replays one complete upstream chat completion."""
    return replayed(translator(ctx), chat)


def translator(ctx: RequestContext) -> ResponseStream:
    return ResponseStream(ctx)


class ResponseStream:
    """Reasoning and text items stream their deltas; a tool call becomes its item (function, custom or
    shell: known only from all its arguments) when it ends. `response.completed` is the terminal event."""

    def __init__(self, ctx: RequestContext):
        self.ctx, self.stream = ctx, _Stream()
        self.hex, self.kinds = _hex(ctx), tool_kinds(request_body(ctx).get("tools"))
        self.started = False
        self.items = 0  # output items announced
        self.open: tuple[str, str] | None = None  # the open reasoning or message item: (type, text so far)
        self.call: PendingCall | None = None

    def events(self, chunk: dict) -> list[bytes]:
        if not self.started:
            self.started = True
            opening = {**_envelope(self.ctx, "in_progress"), "output": [], "usage": None}
            self.stream.emit("response.created", response=opening)
            self.stream.emit("response.in_progress", response=opening)
        for piece in pieces(chunk):
            self._piece(piece)
        return self.stream.take()

    def closing(self, chat: dict) -> list[bytes]:
        self.events({})
        self._close()
        if self.items == 0:  # an empty answer is one empty message
            self._open("message")
            self._close()
        return self.stream.take()

    def terminal(self, chat: dict) -> list[bytes]:
        self.stream.emit("response.completed", response=from_chat_response(chat, self.ctx))
        return self.stream.take()

    def error(self, status: int, message: str, kind: str) -> list[bytes]:
        """`response.failed` carrying the error's code and message (after `response.created`, which a
        failure before the stream began is sent first)."""
        response = {**_envelope(self.ctx, "in_progress"), "output": [], "usage": None}
        if not self.started:
            self.started = True
            self.stream.emit("response.created", response=response)
        failed = {**response, "status": "failed", "error": failure(status, message)}
        self.stream.emit("response.failed", response=failed)
        return self.stream.take()

    def _piece(self, piece: Piece) -> None:
        if piece.kind == ARGUMENTS:
            if self.call is not None and self.call.index == piece.index:
                self.call.arguments += piece.text
            return
        if piece.kind == CALL:
            self._close()
            self.call = PendingCall(piece.index, piece.call_id, piece.name)
            return
        kind = "reasoning" if piece.kind == REASONING else "message"
        if self.open is None or self.open[0] != kind:
            self._close()
            self._open(kind)
        assert self.open is not None  # just opened, or already open
        self.open = (kind, self.open[1] + piece.text)
        _DELTAS[kind](self.stream, self._where(), piece.text)

    def _open(self, kind: str) -> None:
        self.open = (kind, "")
        self.items += 1
        item = _ITEMS[kind](self.hex, "")
        self.stream.emit("response.output_item.added", output_index=self.items - 1, item=_opening(item))
        _STARTS[kind](self.stream, self._where())

    def _close(self) -> None:
        if self.open is not None:
            kind, text = self.open
            item = _ITEMS[kind](self.hex, text)
            _ENDS[kind](self.stream, self._where(), text)
            self.stream.emit("response.output_item.done", output_index=self.items - 1, item=item)
        elif self.call is not None:
            self.items += 1
            _call_events(self.stream, self.items - 1, _call_item(self.call.as_chat(), f"{self.hex}_{self.call.index}",
                                                                 self.kinds))
        self.open, self.call = None, None

    def _where(self) -> dict:
        prefix = "rs_" if self.open and self.open[0] == "reasoning" else "msg_"
        return {"item_id": prefix + self.hex, "output_index": self.items - 1}


def failure(status: int, message: str) -> dict:
    """A failed response's `error`: Codex reads the code (`context_length_exceeded` is final, any other retried)."""
    if is_overflow(status, message):
        return {"code": CONTEXT_OVERFLOW, "message": message}
    return {"code": "server_error" if status >= 500 else "invalid_prompt", "message": message}


def is_overflow(status: int, message: str) -> bool:
    """Whether an error says the prompt does not fit the model's context."""
    return status < 500 and bool(_OVERFLOW.search(message or ""))


def _envelope(ctx: RequestContext, status: str) -> dict:
    """Top-level fields, echoing the harness's request the way the Responses API does."""
    body = request_body(ctx)
    text, reasoning = (value if isinstance(value, dict) else {} for value in (body.get("text"), body.get("reasoning")))
    return {
        "id": "resp_" + _hex(ctx), "object": "response", "created_at": ctx.created, "status": status,
        "model": ctx.requested_model, "error": None, "incomplete_details": None,
        "instructions": body.get("instructions"), "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"), "previous_response_id": None,
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": False, "text": {"format": {"type": "text"}, **text}, "truncation": "disabled",
        "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
    }


def _output(message: dict, ctx: RequestContext) -> list[dict]:
    """Output items in the order the model produced them: reasoning, text, tool calls."""
    hex_id, items = _hex(ctx), []
    thought = reasoning_text(message)
    calls = message.get("tool_calls") or []
    if thought:
        items.append(_reasoning_item(hex_id, thought))
    text = message.get("content") or ""
    if text or not (calls or thought):
        items.append(_message_item(hex_id, text))
    kinds = tool_kinds(request_body(ctx).get("tools"))
    items += [_call_item(call, f"{hex_id}_{i}", kinds) for i, call in enumerate(calls)]
    return items


def _reasoning_item(hex_id: str, text: str) -> dict:
    return {"type": "reasoning", "id": "rs_" + hex_id, "status": "completed",
            "summary": [{"type": "summary_text", "text": text}], "encrypted_content": seal_reasoning(text)}


def _message_item(hex_id: str, text: str) -> dict:
    return {"type": "message", "id": "msg_" + hex_id, "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(call: dict, suffix: str, kinds: dict[str, str]) -> dict:
    """One tool call as the item type of the tool the harness declared (function by default)."""
    function = call.get("function") or {}
    name, arguments = function.get("name") or "", function.get("arguments") or ""
    call_id = call.get("id") or "call_" + suffix
    kind = kinds.get(name, "function")
    action = shell_action(kind, arguments) if kind in SHELL_KINDS else None
    if action is not None:
        prefix, item_type = ("lsh_", "local_shell_call") if kind == "local_shell" else ("sh_", "shell_call")
        return {"type": item_type, "id": prefix + suffix, "call_id": call_id, "action": action,
                "status": "completed"}
    custom_input = _custom_input(arguments) if kind == "custom" else None
    if custom_input is not None:
        return {"type": "custom_tool_call", "id": "ctc_" + suffix, "call_id": call_id, "name": name,
                "input": custom_input}
    return {"type": "function_call", "id": "fc_" + suffix, "call_id": call_id, "name": name,
            "arguments": arguments, "status": "completed"}


def _custom_input(arguments: str) -> str | None:
    try:
        args = json.loads(arguments)
    except (TypeError, ValueError):
        return None
    return args["input"] if isinstance(args, dict) and isinstance(args.get("input"), str) else None


def _usage(chat: dict) -> dict:
    """Responses usage; the details objects are always present (Codex requires them)."""
    usage = usage_of(chat)
    return {"input_tokens": usage.prompt,
            "input_tokens_details": {"cached_tokens": usage.cached, "cache_write_tokens": 0},
            "output_tokens": usage.completion,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning},
            "total_tokens": usage.prompt + usage.completion}


class _Stream:
    """Collects SSE frames, numbering events from 0 in emission order; `take` hands over the new ones."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.sent = 0

    def emit(self, event: str, **fields: object) -> None:
        payload = {"type": event, "sequence_number": len(self.frames), **fields}
        self.frames.append(sse_frame(payload, event=event))

    def take(self) -> list[bytes]:
        new, self.sent = self.frames[self.sent:], len(self.frames)
        return new


def _call_events(stream: _Stream, index: int, item: dict) -> None:
    """added -> the call's own delta/done events -> done, for one tool-call item."""
    stream.emit("response.output_item.added", output_index=index, item=_opening(item))
    where = {"item_id": item["id"], "output_index": index}
    if item["type"] == "function_call":
        if item["arguments"]:
            stream.emit("response.function_call_arguments.delta", **where, delta=item["arguments"])
        stream.emit("response.function_call_arguments.done", **where, name=item["name"],
                    arguments=item["arguments"])
    elif item["type"] == "custom_tool_call":
        stream.emit("response.custom_tool_call_input.delta", **where, delta=item["input"])
        stream.emit("response.custom_tool_call_input.done", **where, input=item["input"])
    stream.emit("response.output_item.done", output_index=index, item=item)


def _opening(item: dict) -> dict:
    """The item as first announced: nothing generated yet."""
    empty = _NOTHING_YET.get(item["type"], {})
    status = {"status": "in_progress"} if "status" in item else {}
    return {**item, **empty, **status}


def _summary_start(stream: _Stream, where: dict) -> None:
    stream.emit("response.reasoning_summary_part.added", **where, summary_index=0,
                part={"type": "summary_text", "text": ""})


def _summary_delta(stream: _Stream, where: dict, text: str) -> None:
    stream.emit("response.reasoning_summary_text.delta", **where, summary_index=0, delta=text)


def _summary_end(stream: _Stream, where: dict, text: str) -> None:
    stream.emit("response.reasoning_summary_text.done", **where, summary_index=0, text=text)
    stream.emit("response.reasoning_summary_part.done", **where, summary_index=0,
                part={"type": "summary_text", "text": text})


def _text_start(stream: _Stream, where: dict) -> None:
    stream.emit("response.content_part.added", **where, content_index=0, part=_output_text(""))


def _text_delta(stream: _Stream, where: dict, text: str) -> None:
    stream.emit("response.output_text.delta", **where, content_index=0, delta=text, logprobs=[])


def _text_end(stream: _Stream, where: dict, text: str) -> None:
    stream.emit("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
    stream.emit("response.content_part.done", **where, content_index=0, part=_output_text(text))


def _output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": []}


Emit = Callable[[_Stream, dict], None]
EmitText = Callable[[_Stream, dict, str], None]
_ITEMS: dict[str, Callable[[str, str], dict]] = {"reasoning": _reasoning_item, "message": _message_item}
_STARTS: dict[str, Emit] = {"reasoning": _summary_start, "message": _text_start}
_DELTAS: dict[str, EmitText] = {"reasoning": _summary_delta, "message": _text_delta}
_ENDS: dict[str, EmitText] = {"reasoning": _summary_end, "message": _text_end}


def _hex(ctx: RequestContext) -> str:
    """The id part shared by every id of this response, taken from the completion id."""
    return re.sub(r"[^A-Za-z0-9]", "", ctx.completion_id.split("-", 1)[-1]) or "0"


def _is_strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)
