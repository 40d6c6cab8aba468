"""The live stream translators of the four APIs, fed vLLM chunks (real stream fixtures, and answers cut
into one-character chunks): their events equal the synthetic stream of the same completion once
consecutive deltas are joined, and they end with the terminal events the synthetic stream ends with.
"""

from __future__ import annotations

import json

import pytest
from live import fixture_body
from tracetap.capture import sse
from tracetap.capture.adapters import ADAPTERS
from tracetap.capture.adapters.base import RequestContext
from tracetap.capture.chat_fold import ChatFold

STREAMS = ["chat_stream", "chat_stream_eos", "chat_stream_tools", "chat_stream_tools_named"]
WHOLE = ["chat_basic", "chat_tools_auto_call", "chat_length", "chat_eos", "chat_stop"]
TERMINAL = {"openai_chat": ["[DONE]"], "anthropic_messages": ["message_delta", "message_stop"],
            "openai_responses": ["response.completed"], "gemini": ["final"]}
BODY = {"openai_chat": {"stream_options": {"include_usage": True}, "logprobs": True},
        "openai_responses": {"tools": [{"type": "function", "name": "Bash"}]}}


def ctx(api: str) -> RequestContext:
    return RequestContext(requested_model="m", served_model="tiny", stream=True, completion_id="cmpl-abc",
                          created=1, path="/", extra={"request": BODY.get(api, {})})


def chunks_of(name: str) -> list[dict]:
    """A fixture's chunks; the first carries the prompt's usage, as with the continuous usage stats the
    gateway always asks for (chat_stream_eos was recorded without them)."""
    chunks = [json.loads(d) for d in sse.payloads(fixture_body(name).decode()) if d != sse.DONE]
    prompt = {"prompt_tokens": len(chunks[0]["prompt_token_ids"]), "completion_tokens": 0}
    chunks[0]["usage"] = chunks[0].get("usage") or prompt
    return chunks


def cut(chat: dict) -> list[dict]:
    """A complete answer as vLLM would stream it: one character per chunk, tool calls opened then filled."""
    message = chat["choices"][0]["message"]
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "usage": chat["usage"]}]
    for key in ("reasoning", "content"):
        chunks += [{"choices": [{"index": 0, "delta": {key: c}}]} for c in message.get(key) or ""]
    for index, call in enumerate(message.get("tool_calls") or []):
        head = {"index": index, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"]}}
        chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [head]}}]})
        pieces = [{"index": index, "function": {"arguments": c}} for c in call["function"]["arguments"]]
        chunks += [{"choices": [{"index": 0, "delta": {"tool_calls": [piece]}}]} for piece in pieces]
    return chunks


def live(api: str, chunks: list[dict], chat: dict) -> tuple[list[bytes], list[bytes]]:
    """(events before the terminal part, the terminal part) of a live translation."""
    translator = ADAPTERS[api].translator(ctx(api))
    frames = [frame for chunk in chunks for frame in translator.events(chunk)]
    return frames + translator.closing(chat), translator.terminal(chat)


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


def folded(chunks: list[dict]) -> dict:
    fold = ChatFold()
    for chunk in chunks:
        fold.add(chunk)
    return fold.body()


@pytest.mark.parametrize("api", list(ADAPTERS))
@pytest.mark.parametrize("name", STREAMS)
def test_live_translation_of_a_real_stream_equals_the_synthetic_one(api, name):
    chunks = chunks_of(name)
    chat = folded(chunks)
    before, terminal = live(api, chunks, chat)
    synthetic = ADAPTERS[api].to_sse_events(chat, ctx(api))
    assert joined(events(before + terminal)) == joined(events(synthetic))
    assert [kind for kind, _ in events(terminal)][-len(TERMINAL[api]):] == TERMINAL[api]
    assert not set(TERMINAL[api]) & {kind for kind, _ in events(before)}


@pytest.mark.parametrize("api", list(ADAPTERS))
@pytest.mark.parametrize("name", WHOLE)
def test_one_character_chunks_give_the_synthetic_stream(api, name):
    chat = json.loads(fixture_body(name))
    chat["choices"][0]["message"]["reasoning"] = "Let me think."
    before, terminal = live(api, cut(chat), chat)
    assert joined(events(before + terminal)) == joined(events(ADAPTERS[api].to_sse_events(chat, ctx(api))))


@pytest.mark.parametrize("api", list(ADAPTERS))
def test_an_error_mid_stream_is_in_the_api_shape(api):
    translator = ADAPTERS[api].translator(ctx(api))
    translator.events(chunks_of("chat_stream")[0])
    (kind, payload), *_ = events(translator.error(502, "engine died", "upstream_error"))
    text = json.dumps(payload)
    assert "engine died" in text and kind not in TERMINAL[api]
