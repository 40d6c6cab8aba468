"""Typed readers of an upstream chat answer's fields, for `upstream.parse_chat_response`.

Each reader returns the field as the store's column holds it, or raises `InvalidAnswer` when the
upstream sent a type no column (and no adapter) can hold: token ids that are not int32 integers,
a `finish_reason` object, a count that is not a number, tool calls that are not objects. Such an
answer is recorded as an `upstream_error` with its body and answered 502, never half stored.
Logprobs are softer: a list that does not line up with the sampled ids is dropped whole and named
as a problem, so the call is kept (`degraded`) but never trained on.
"""

from __future__ import annotations

import json
from itertools import repeat
from typing import TypeGuard

INT32_MAX = 2**31 - 1
_INT, _NUMBER, _OBJECT = frozenset({int}), frozenset({int, float}), frozenset({dict})


class InvalidAnswer(ValueError):
    """An upstream answer the gateway cannot use; the message says which field and why."""


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def token_ids(value: object, where: str) -> list[int] | None:
    """A list of token ids (int32, not negative), or None when the field is absent."""
    if value is None:
        return None
    if not isinstance(value, list) or not (_all_of(value, _INT) and 0 <= min(value, default=0)
                                           and max(value, default=0) <= INT32_MAX):
        raise InvalidAnswer(f"{where} must be a list of token ids (integers from 0 to {INT32_MAX})")
    return value


def _all_of(values: list, kinds: frozenset[type]) -> bool:
    """Whether every item's exact type is one of `kinds` (JSON's own: no subclasses, so bools are no
    ints), checked in C: a long answer's ids and logprobs are tens of thousands of items."""
    return set(map(type, values)) <= kinds


def count(value: object, where: str) -> int | None:
    """A token count (int32, not negative), or None."""
    if value is None:
        return None
    if not is_int(value) or not 0 <= value <= INT32_MAX:
        raise InvalidAnswer(f"{where} must be a token count, got {_shown(value)}")
    return value


def text(value: object, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidAnswer(f"{where} must be a string, got {_shown(value)}")
    return value


def stop_reason(value: object) -> str | int | None:
    """vLLM's `stop_reason`: the matched stop string, the stop token id, or None."""
    if value is None or isinstance(value, str) or is_int(value):
        return value
    raise InvalidAnswer(f"choices[0].stop_reason must be a string or a token id, got {_shown(value)}")


def mapping(value: object, where: str) -> dict:
    """An object field ({} when absent)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidAnswer(f"{where} must be an object, got {_shown(value)}")
    return value


def objects(value: object, where: str) -> list[dict]:
    """A list of objects ([] when absent)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise InvalidAnswer(f"{where} must be a list of objects")
    return value


def usage(value: object) -> dict:
    """`usage` with every count the adapters read checked (details included)."""
    found = mapping(value, "usage")
    for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        count(found.get(name), f"usage.{name}")
    for name, key in (("prompt_tokens_details", "cached_tokens"), ("completion_tokens_details", "reasoning_tokens")):
        count(mapping(found.get(name), f"usage.{name}").get(key), f"usage.{name}.{key}")
    return found


def tool_calls(value: object) -> list[dict]:
    """The message's tool calls as the `tool_calls` column holds them (id, name, arguments text)."""
    out = []
    for index, call in enumerate(objects(value, "choices[0].message.tool_calls")):
        where = f"choices[0].message.tool_calls[{index}]"
        function = mapping(call.get("function"), f"{where}.function")
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append({"id": text(call.get("id"), f"{where}.id"),
                    "name": text(function.get("name"), f"{where}.function.name"), "arguments": arguments})
    return out


def aligned_logprobs(entries: object, ids: list[int] | None) -> tuple[list[float] | None, str | None]:
    """(one logprob per sampled id, None) or (None, the problem); (None, None) when none were sent."""
    if entries is None or ids is None:
        return None, None
    if not isinstance(entries, list) or not _all_of(entries, _OBJECT):
        return None, "upstream logprobs are not a list of entries"
    if len(entries) != len(ids):
        return None, f"upstream sent {len(entries)} logprobs for {len(ids)} sampled tokens"
    values: list = list(map(dict.get, entries, repeat("logprob")))
    if not _all_of(values, _NUMBER):
        return None, "upstream logprobs are not all numbers"
    return list(map(float, values)), None


def top_logprobs(entries: list[dict] | None) -> list[list[dict]] | None:
    """The alternatives of aligned entries, or None when none has any (or they are malformed)."""
    if not entries or not any(e.get("top_logprobs") for e in entries):
        return None
    try:
        return [[_top_entry(top) for top in objects(e.get("top_logprobs"), "top_logprobs")] for e in entries]
    except InvalidAnswer:
        return None


def _top_entry(top: dict) -> dict:
    token, token_id, logprob = top.get("token"), top.get("token_id"), top.get("logprob")
    if token_id is None and isinstance(token, str) and token.startswith("token_id:"):
        digits = token.removeprefix("token_id:")
        token_id = int(digits) if digits.isdigit() else None
    if not (token_id is None or is_int(token_id) and 0 <= token_id <= INT32_MAX) \
            or not (token is None or isinstance(token, str)) or not (logprob is None or is_number(logprob)):
        raise InvalidAnswer("top_logprobs entry with a field of the wrong type")
    return {"token_id": token_id, "token": token, "logprob": logprob}


def _shown(value: object) -> str:
    """A short description of a bad value for the error message."""
    return f"{type(value).__name__} {json.dumps(value, ensure_ascii=False, default=str)[:60]}"
