"""Reading and validating request bodies; every rejection is an `EngineError` in vLLM's error shape."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tracetap.tokens.message import ToolUse

MAX_TOP_LOGPROBS = 20  # vLLM's default --max-logprobs
CONSTRAINTS = ("response_format", "structured_outputs")  # structured outputs, as vLLM takes them on both routes


class EngineError(Exception):
    """A client-visible failure; `body()` is vLLM's `{"error": {message, type, param, code}}`."""

    def __init__(
        self, message: str, status: int = 400, kind: str = "BadRequestError", param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.status}}


def invalid(field_name: str, problem: str, kind: str = "value_error") -> EngineError:
    """A body-validation error worded like vLLM's pydantic ones (type `Bad Request`, param `body.<field>`)."""
    loc = f"body.{field_name}" if field_name else "body"
    detail = {"type": kind, "loc": loc, "msg": problem}
    return EngineError(f"1 validation error:\n  {detail}", kind="Bad Request", param=loc)


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object."""
    try:
        body = json.loads(raw or b"")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise invalid(str(getattr(exc, "pos", 0)), f"JSON decode error: {exc}", "json_invalid") from None
    if not isinstance(body, dict):
        raise invalid("", "Input should be a valid dictionary", "dict_type")
    return body


@dataclass(frozen=True, kw_only=True)
class Generation:
    """The sampling and token-data fields both completion routes share, validated."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    return_token_ids: bool = False
    stream: bool = False
    include_usage: bool = False  # stream_options: a last chunk with the usage
    constraints: dict[str, Any] = field(default_factory=dict)  # accepted, not enforced (server.py says so)

    @property
    def candidates(self) -> int:
        """How many best tokens the model lists per step: chat's `top_logprobs` counts the sampled one."""
        return self.top_logprobs


@dataclass(frozen=True, kw_only=True)
class ChatRequest(Generation):
    """The `/v1/chat/completions` fields the engine honours, validated."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def parse_tools(self) -> bool:
        """Tool calls are parsed out of the text when tools are offered and not switched off, as in vLLM."""
        return ToolUse.of(self.tools, self.tool_choice).parse


@dataclass(frozen=True, kw_only=True)
class CompletionRequest(Generation):
    """The `/v1/completions` fields the engine honours: one prompt, as text or as token ids."""

    prompt: str | list[int]
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (with include_usage): usage on every chunk
    tokens_as_ids: bool = False  # return_tokens_as_token_ids: logprobs name tokens `token_id:N`

    @property
    def candidates(self) -> int:
        """The legacy `logprobs: k` lists the sampled token and the k best, so k + 1 may be needed."""
        return self.top_logprobs + 1 if self.logprobs else 0


def parse_chat(body: dict[str, Any], max_model_len: int) -> ChatRequest:
    """Validate a chat request; unknown fields are ignored, as vLLM ignores ones it does not use."""
    if "messages" not in body:
        raise invalid("messages", "Field required", "missing")
    messages = _messages(body["messages"])
    tools = _optional(body, "tools", list)
    logprobs = bool(_optional(body, "logprobs", bool))
    top_logprobs = _top_logprobs(body, "top_logprobs") or 0
    if top_logprobs and not logprobs:
        raise EngineError("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
    return ChatRequest(
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        template_kwargs=_optional(body, "chat_template_kwargs", dict) or {},
        **_generation(body, max_model_len, None), logprobs=logprobs, top_logprobs=top_logprobs,
    )


def parse_completion(body: dict[str, Any], max_model_len: int) -> CompletionRequest:
    """Validate a completions request; `max_tokens` defaults to 16 there, as in vLLM and OpenAI."""
    if "prompt" not in body:
        raise invalid("prompt", "Field required", "missing")
    if _optional(body, "echo", bool):
        raise EngineError("The embedded engine does not support `echo`.", param="echo")
    top = _top_logprobs(body, "logprobs")
    generation = _generation(body, max_model_len, 16)
    continuous = (_optional(body, "stream_options", dict) or {}).get("continuous_usage_stats")
    return CompletionRequest(
        prompt=_prompt(body["prompt"]), **generation, logprobs=top is not None, top_logprobs=top or 0,
        continuous_usage=bool(continuous and generation["include_usage"]),  # vLLM: only with include_usage
        tokens_as_ids=bool(_optional(body, "return_tokens_as_token_ids", bool)),
    )


def _generation(body: dict[str, Any], max_model_len: int, default_max: int | None) -> dict[str, Any]:
    """The shared fields of either route, as keyword arguments."""
    if (_optional(body, "n", int) or 1) != 1:
        raise EngineError("The embedded engine answers one choice per request (n=1).", param="n")
    max_tokens = _max_tokens(body, max_model_len)
    return {
        "max_tokens": default_max if max_tokens is None else max_tokens,
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(body, "top_p", 1.0, 1e-9, 1.0),
        "seed": _optional(body, "seed", int),
        "stop": _stop(body.get("stop")),
        "stop_token_ids": _stop_token_ids(body),
        "return_token_ids": bool(_optional(body, "return_token_ids", bool)),
        "stream": bool(_optional(body, "stream", bool)),
        "include_usage": bool((_optional(body, "stream_options", dict) or {}).get("include_usage")),
        "constraints": {name: body[name] for name in CONSTRAINTS if _optional(body, name, dict) is not None},
    }


def _top_logprobs(body: dict[str, Any], name: str) -> int | None:
    value = _optional(body, name, int)
    if value is not None and not 0 <= value <= MAX_TOP_LOGPROBS:
        raise EngineError(f"{name} must be between 0 and {MAX_TOP_LOGPROBS}", param=name)
    return value


def _prompt(value: Any) -> str | list[int]:
    """Text, token ids, or a batch of exactly one of either (the SDK's `prompt=[ids]`)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], list | str):
        value = value[0]
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return value
    if isinstance(value, list) and value and all(isinstance(p, list | str) for p in value):
        raise EngineError("The embedded engine answers one prompt per request.", param="prompt")
    raise invalid("prompt", "Input should be a non-empty string or a non-empty list of token ids", "prompt_type")


def _optional(body: dict[str, Any], name: str, kind: type) -> Any:
    """`body[name]` when present and not null, checked against `kind` (bool is not an int here)."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise invalid(name, f"Input should be a valid {kind.__name__}", f"{kind.__name__}_type")
    return value


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise EngineError(f"{name} must be a number in [{low}, {high}], got {value!r}.", param=name)
    return float(value)


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise invalid("messages", "Input should be a non-empty list of messages", "list_type")
    for index, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise invalid(f"messages.{index}", "Each message needs a string `role`", "missing")
    return value


def _max_tokens(body: dict[str, Any], max_model_len: int) -> int | None:
    """`max_completion_tokens` wins over `max_tokens`, as in vLLM; more than the context is an error."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = _optional(body, name, int)
    if value is None:
        return None
    if value < 1:
        raise EngineError(f"{name} must be at least 1, got {value}.", param=name)
    if value > max_model_len:
        raise EngineError(
            f"{name}={value} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. (parameter={name}, value={value})",
            param=name,
        )
    return value


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("stop", "Input should be a string or a list of strings", "string_type")
    return [s for s in stops if s]


def _stop_token_ids(body: dict[str, Any]) -> list[int]:
    ids = _optional(body, "stop_token_ids", list) or []
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise invalid("stop_token_ids", "Input should be a list of integers", "int_type")
    return ids


def _tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> str | dict[str, Any] | None:
    """Check a named choice names an offered tool (the engine does no constrained decoding)."""
    if value is None or value in ("none", "auto", "required"):
        return value
    name = (value.get("function") or {}).get("name") if isinstance(value, dict) else None
    offered = {(tool.get("function") or {}).get("name") for tool in tools or []}
    if name is None or name not in offered:
        raise EngineError(
            "The tool specified in `tool_choice` does not match any of the specified `tools` "
            "(parameter=tool_choice)",
            param="tool_choice",
        )
    return value
