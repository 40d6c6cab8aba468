"""SSE frames of any of the four APIs as (event kind, payload), and the same stream with consecutive deltas
joined: a live stream and the synthetic stream of the same completion are equal once joined."""

from __future__ import annotations

import json

__all__ = ["events", "joined", "split_frames"]


def split_frames(raw: bytes) -> list[bytes]:
    """A whole SSE body as its frames."""
    return [frame + b"\n\n" for frame in raw.replace(b"\r\n", b"\n").split(b"\n\n") if frame.strip()]


def events(frames: list[bytes]) -> list[tuple[str, dict | str]]:
    out: list[tuple[str, dict | str]] = []
    for frame in frames:
        lines = frame.decode().strip("\n").split("\n")
        data = lines[-1].removeprefix("data: ")
        payload = data if data == "[DONE]" else json.loads(data)
        kind = lines[0].removeprefix("event: ") if len(lines) == 2 else _kind(payload)
        if isinstance(payload, dict):
            payload.pop("sequence_number", None)
        out.append((kind, payload))
    return out


def _kind(payload: dict | str) -> str:
    if payload == "[DONE]":
        return "[DONE]"
    assert isinstance(payload, dict)
    if "candidates" in payload:
        return "final" if "finishReason" in payload["candidates"][0] else "part"
    return "chunk"


def joined(items: list[tuple[str, dict | str]]) -> list[tuple[str, dict | str]]:
    """Consecutive deltas of one block, item or part kind as one event (what one big chunk would give)."""
    out: list[tuple[str, dict | str]] = []
    for kind, payload in items:
        if out and _joins(out[-1], (kind, payload)):
            out[-1] = (kind, _join(out[-1][1], payload))
        else:
            out.append((kind, payload))
    return out


def _joins(a: tuple[str, object], b: tuple[str, object]) -> bool:
    (kind_a, x), (kind_b, y) = a, b
    same = kind_a == kind_b or (kind_a, kind_b) == ("part", "final")  # Gemini's last text rides the final chunk
    if not same or not isinstance(x, dict) or not isinstance(y, dict):
        return False
    return _slot(kind_a, x) is not None and _slot(kind_a, x) == _slot(kind_b, y)


def _slot(kind: str, payload: dict) -> tuple | None:
    """What a delta adds to, or None for events that are not deltas."""
    if kind == "content_block_delta":
        return payload["index"], payload["delta"]["type"]
    if kind.endswith(".delta"):
        return kind, payload.get("item_id")
    if kind in ("part", "final"):
        parts = payload["candidates"][0]["content"]["parts"]
        return tuple(sorted(k for k in parts[0] if k != "text")) if len(parts) == 1 else None
    if kind == "chunk" and payload["choices"] and payload["choices"][0]["finish_reason"] is None:
        delta = payload["choices"][0]["delta"]
        calls = delta.get("tool_calls") or [{}]
        if "role" not in delta and "id" not in calls[0]:
            return tuple(sorted(delta)), calls[0].get("index")
    return None


def _join(x: dict | str, y: dict | str) -> dict:
    """x with y's text appended wherever y has text (deltas, parts, arguments)."""
    assert isinstance(x, dict) and isinstance(y, dict)
    out = dict(x)
    for key, value in y.items():
        if key not in x:
            out[key] = value
        elif isinstance(value, str) and key in ("text", "delta", "thinking", "partial_json", "content",
                                                  "reasoning", "reasoning_content", "arguments"):
            out[key] = x[key] + value
        elif isinstance(value, dict):
            out[key] = _join(x[key], value)
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            out[key] = [_join(a, b) for a, b in zip(x[key], value, strict=True)]
    return out


