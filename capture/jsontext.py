"""JSON text that always encodes: what the gateway stores, forwards and answers.

JSON bodies may carry lone surrogates (`"\\ud800"`, or the raw bytes ED A0 80, which `json.loads`
reads as one). Such a string has no UTF-8 form, so Parquet, sockets and `.encode()` refuse it.
Here every lone surrogate is written as its `\\udXXX` escape instead: valid JSON that reads back
to the very same string, so nothing is dropped and nothing fails to encode.
"""

from __future__ import annotations

import json


def escape_surrogates(text: str) -> str:
    """`text` with each lone surrogate as a `\\udXXX` escape (unchanged when it has none)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def dumps(value: object) -> str:
    """Compact JSON, non-ASCII kept, lone surrogates escaped (the escape is valid inside a JSON string);
    never NaN or Infinity, which are not JSON (bodies are parsed strictly, so none should get here)."""
    return escape_surrogates(_encode(value))


def dump_bytes(value: object) -> bytes:
    """`dumps` as UTF-8 bytes, encoded once: a body the gateway sends, upstream or to the caller."""
    return _encode(value).encode("utf-8", "backslashreplace")


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))  # made once: json.dumps
# with options builds an encoder per call (~0.6 us of a small body's ~2)


def _encode(value: object) -> str:
    return _ENCODER.encode(value)
