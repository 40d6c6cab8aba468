"""The live stream translators of the four APIs, fed vLLM chunks (real stream fixtures, and answers cut
into one-character chunks): their events equal the synthetic stream of the same completion once
consecutive deltas are joined, and they end with the terminal events the synthetic stream ends with.
"""

from __future__ import annotations

import json

import pytest
from live import fixture_body
from sse_events import events, joined
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
    return [json.loads(d) for d in sse.payloads(fixture_body(name).decode()) if d != sse.DONE]


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


@pytest.mark.parametrize("reasoning", ["Let me think.", None], ids=["reasoning", "no_reasoning"])
@pytest.mark.parametrize("api", list(ADAPTERS))
@pytest.mark.parametrize("name", WHOLE)
def test_one_character_chunks_give_the_synthetic_stream(api, name, reasoning):
    chat = json.loads(fixture_body(name))
    chat["choices"][0]["message"]["reasoning"] = reasoning
    before, terminal = live(api, cut(chat), chat)
    assert joined(events(before + terminal)) == joined(events(ADAPTERS[api].to_sse_events(chat, ctx(api))))


@pytest.mark.parametrize("api", list(ADAPTERS))
def test_an_error_mid_stream_is_in_the_api_shape(api):
    translator = ADAPTERS[api].translator(ctx(api))
    translator.events(chunks_of("chat_stream")[0])
    (kind, payload), *_ = events(translator.error(502, "engine died", "upstream_error"))
    text = json.dumps(payload)
    assert "engine died" in text and kind not in TERMINAL[api]


@pytest.mark.parametrize("reasoning", ["Let me think.", None], ids=["reasoning", "no_reasoning"])
@pytest.mark.parametrize("name", WHOLE)
def test_responses_stream_items_are_the_final_output(name, reasoning):
    """Checked against `from_chat_response`, which builds the output without the translator."""
    chat = json.loads(fixture_body(name))
    chat["choices"][0]["message"]["reasoning"] = reasoning
    before, terminal = live("openai_responses", cut(chat), chat)
    done = [payload["item"] for kind, payload in events(before) if kind == "response.output_item.done"]
    final = ADAPTERS["openai_responses"].from_chat_response(chat, ctx("openai_responses"))
    assert done == final["output"] == events(terminal)[-1][1]["response"]["output"]


@pytest.mark.parametrize("name", WHOLE)
def test_chat_stream_folds_back_into_the_answer(name):
    chat = json.loads(fixture_body(name))
    before, terminal = live("openai_chat", cut(chat), chat)
    fold = ChatFold()
    for _, payload in events(before + terminal):
        if isinstance(payload, dict):
            fold.add(payload)
    message, original = fold.body()["choices"][0]["message"], chat["choices"][0]["message"]
    assert (message["content"] or None, message.get("tool_calls")) == (original.get("content") or None,
                                                                       original.get("tool_calls"))
