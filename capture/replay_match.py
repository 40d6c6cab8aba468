"""When two chat requests are "the same call" for replay, and what differs when they are not.

Pure functions, no I/O. A request's match key is the SHA-256 of its canonical JSON (sorted keys) where
everything that varies between two runs of the same agent, or between two APIs saying the same
thing, is taken out or written one way:

- top-level keys that do not change what the model sees: `model` (harnesses name models freely and
  the gateway maps any name to the served one), `stream` / `stream_options` (a replay answers in
  the caller's stream mode), `metadata`, `user`, and the upstream-only token flags the gateway adds
  (`logprobs: true`, `return_token_ids`, SGLang's `return_*`); `top_logprobs` stays, it is what the
  caller asked for;
- ids: tool-call ids (`tool_calls[].id`, `tool_call_id`) become `call-0`, `call-1`, ... in order of
  first appearance, so the links between calls and results still count but not the random ids;
- spelling: JSON nulls are dropped (null means "not given" in these APIs), `reasoning_content` is
  read as `reasoning`, and tool-call `arguments` strings are compared as the JSON they hold;
- the caller's `--replay-ignore` paths.

Timestamps and per-request hashes inside the text are the adapters' business: the Anthropic adapter
already strips Claude Code's billing line from the system prompt, so it never reaches the key.
Secrets are masked the way the recorder masks them (`redact.redact`), so a live request and its
recorded copy look alike.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, cast

from tracetap.capture.redact import redact

VOLATILE = ("model", "stream", "stream_options", "metadata", "user", "logprobs", "return_token_ids",
            "return_prompt_token_ids", "return_meta_info")
T = TypeVar("T")
L = TypeVar("L")  # what labels a candidate of `closest`
WILDCARD = "*"
_SHOWN = 80  # characters of a value shown in a difference


def canonical(request: dict, ignore: Sequence[str] = ()) -> dict:
    """The request as matching sees it (see the module doc); `ignore` holds dotted paths."""
    out = _without_nulls(redact(copy.deepcopy(request)))
    for key in VOLATILE:
        out.pop(key, None)
    if isinstance(out.get("messages"), list):
        aliases: dict[str, str] = {}
        out["messages"] = [_message(m, aliases) if isinstance(m, dict) else m for m in out["messages"]]
    for path in ignore:
        _drop(out, path.split("."))
    return out


def match_key(canonical_request: dict) -> str:
    """SHA-256 (hex) of the canonical JSON: sorted keys, no spaces, non-ASCII kept."""
    text = json.dumps(canonical_request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def check_ignore_path(path: str) -> str:
    """A `--replay-ignore` path: dot-separated keys or list indexes, `*` for any; raises ValueError."""
    if not path or any(not part for part in path.split(".")):
        raise ValueError(f"invalid ignore path {path!r}: expected dotted keys like 'temperature' or "
                         "'tools.*.function.description'")
    return path


def _without_nulls(value: T) -> T:
    if isinstance(value, dict):
        return cast(T, {k: _without_nulls(v) for k, v in value.items() if v is not None})
    if isinstance(value, list):
        return cast(T, [_without_nulls(v) for v in value])
    return value


def _message(message: dict, aliases: dict[str, str]) -> dict:
    out = dict(message)
    if "reasoning_content" in out:
        reasoning = out.pop("reasoning_content")
        out["reasoning"] = out.get("reasoning") or reasoning
    if isinstance(out.get("tool_call_id"), str):
        out["tool_call_id"] = _alias(out["tool_call_id"], aliases)
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [_tool_call(c, aliases) if isinstance(c, dict) else c for c in out["tool_calls"]]
    return out


def _tool_call(call: dict, aliases: dict[str, str]) -> dict:
    out = dict(call)
    if isinstance(out.get("id"), str):
        out["id"] = _alias(out["id"], aliases)
    function = out.get("function")
    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
        out["function"] = {**function, "arguments": _json_or_text(function["arguments"])}
    return out


def _alias(call_id: str, aliases: dict[str, str]) -> str:
    return aliases.setdefault(call_id, f"call-{len(aliases)}")


def _json_or_text(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _drop(value: Any, parts: list[str]) -> None:
    """Remove what `parts` names: a dict key goes away, a list item becomes null (indexes stay put)."""
    head, rest = parts[0], parts[1:]
    for key in _children(value, head):
        if rest:
            _drop(value[key], rest)
        elif isinstance(value, dict):
            del value[key]
        else:
            value[key] = None


def _children(value: object, name: str) -> list:
    if isinstance(value, dict):
        return list(value) if name == WILDCARD else [name] if name in value else []
    if isinstance(value, list):
        if name == WILDCARD:
            return list(range(len(value)))
        return [int(name)] if name.isdigit() and int(name) < len(value) else []
    return []


def differences(recorded: object, incoming: object, path: str = "") -> list[str]:
    """What differs between a recorded canonical request and an incoming one, one line per leaf."""
    where = path or "(request)"
    if isinstance(recorded, dict) and isinstance(incoming, dict):
        return _dict_differences(recorded, incoming, path)
    if isinstance(recorded, list) and isinstance(incoming, list):
        found = [line for i, (a, b) in enumerate(zip(recorded, incoming, strict=False))
                 for line in differences(a, b, f"{path}.{i}" if path else str(i))]
        if len(recorded) != len(incoming):
            found.append(f"{where}: {len(recorded)} items recorded, {len(incoming)} in this request")
        return found
    if type(recorded) is type(incoming) and recorded == incoming:
        return []
    return [f"{where}: recorded {_short(recorded)}, this request {_short(incoming)}"]


def _dict_differences(recorded: dict, incoming: dict, path: str) -> list[str]:
    found = []
    for key in sorted(set(recorded) | set(incoming), key=str):
        where = f"{path}.{key}" if path else str(key)
        if key not in incoming:
            found.append(f"{where}: only in the recording ({_short(recorded[key])})")
        elif key not in recorded:
            found.append(f"{where}: only in this request ({_short(incoming[key])})")
        else:
            found += differences(recorded[key], incoming[key], where)
    return found


def closest(incoming: dict, candidates: Iterable[tuple[L, dict]]) -> tuple[L, list[str]] | None:
    """The candidate (label, canonical request) with the fewest differences; the first one on ties."""
    best: tuple[L, list[str]] | None = None
    for label, recorded in candidates:
        found = differences(recorded, incoming)
        if best is None or len(found) < len(best[1]):
            best = (label, found)
    return best


def _short(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."
