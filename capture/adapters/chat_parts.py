"""Pieces of an upstream chat response that every provider adapter reads the same way.

Usage counts, the matched stop string, tool-call arguments as a JSON object (and back again), a
deterministic stand-in for provider reasoning signatures, and stable ids. Pure helpers, no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import NamedTuple

# Arguments that are not a JSON object are handed to the harness as {"_raw": "<text>"} and turned
# back into the same text on the next turn, so the re-rendered history says what the model said.
RAW_ARGUMENTS_KEY = "_raw"
SIGNATURE_PREFIX = "tracetap-sig1:"


class Usage(NamedTuple):
    prompt: int
    completion: int
    cached: int
    reasoning: int


def usage_of(chat: dict) -> Usage:
    """Token counts of a chat response; missing or null details count as 0."""
    usage = chat.get("usage") or {}
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    return Usage(
        prompt=int(usage.get("prompt_tokens") or 0),
        completion=int(usage.get("completion_tokens") or 0),
        cached=int(prompt_details.get("cached_tokens") or usage.get("cached_tokens") or 0),
        reasoning=int(completion_details.get("reasoning_tokens") or 0),
    )


def matched_stop(choice: dict) -> str | None:
    """The stop string that ended generation: vLLM's `stop_reason` when it is a string.

    An int there is a stop token id and null means EOS or length; neither is a stop sequence.
    """
    reason = choice.get("stop_reason")
    return reason if isinstance(reason, str) else None


def arguments_object(arguments: object) -> dict:
    """Tool-call arguments as the JSON object providers require (`{}` when empty)."""
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {RAW_ARGUMENTS_KEY: text}


def arguments_text(arguments: dict) -> str:
    """The inverse of `arguments_object`: the `function.arguments` string sent upstream.

    Serialized like vLLM's tool parsers (`json.dumps`, non-ASCII kept) so history renders alike.
    """
    raw = arguments.get(RAW_ARGUMENTS_KEY)
    if len(arguments) == 1 and isinstance(raw, str):
        return raw
    return json.dumps(arguments, ensure_ascii=False)


def synthetic_signature(text: str) -> str:
    """A signature for reasoning text that no provider can verify but that never changes.

    The same text always gets the same value, so a round trip through the harness is stable.
    """
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    return SIGNATURE_PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def stable_hex(*parts: object, length: int = 24) -> str:
    """Deterministic hex id material derived from `parts` (e.g. a completion id and an index)."""
    joined = "\x1f".join(str(part) for part in parts)
    return hashlib.sha256(joined.encode("utf-8", "surrogatepass")).hexdigest()[:length]
