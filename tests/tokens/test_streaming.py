"""The incremental parser: its deltas, folded, are exactly the message `chat_message` gives for the same ids.

Checked over every real vLLM chat fixture fed token by token, and over many generated replies: pieces of
tags, tool calls (well-formed, malformed, cut off), reasoning, stop strings and stop token ids, characters
split across byte tokens, tokenized canonically or in pieces, fed in chunks of any size.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_chat_parity import JSON_CASES, STREAM_CASES, answered, request, streamed
from tracetap.engine.tokenizer import IM_END_ID, ChatTokenizer
from tracetap.tokens.message import ToolUse, chat_message
from tracetap.tokens.streaming import ReplyStream, Settings

CALL = '{"name": "Bash", "arguments": {"command": "ls"}}'
BLOCKS = [f"<tool_call>\n{CALL}\n</tool_call>", "<think>\nplan\n</think>\n\n", "\n<tool_call>\n{broken\n</tool_call>"]
PIECES = [*BLOCKS, *BLOCKS, "<think>", "</think>", "<tool_call>", "</tool_call>", CALL, '{"name": ', '"Bash"}',
          "\n", "\n\n", " ", "Hi", "Hi \n", "done.", "日本", "é", "STOP", "ST", "<", "/", "think>", "tool_call>",
          "<|im_end|>", "{broken"]
STOP_ID_TEXT = "done."


def fold(stream: ReplyStream, chunks: list[list[int]], finish: str, stop: str | int | None) -> tuple[dict, str]:
    """The message the deltas build, as a client folding the stream would."""
    deltas = [stream.feed(chunk) for chunk in chunks]
    assert all(set(delta) <= {"content", "reasoning"} for delta in deltas)  # calls only when the reply ends
    last, finish_reason = stream.finish(finish, stop)
    message: dict = {"content": None, "reasoning": None, "tool_calls": last.get("tool_calls", [])}
    for delta in [*deltas, last]:
        for key in ("content", "reasoning"):
            if key in delta:
                message[key] = (message[key] or "") + delta[key]
    return message, finish_reason


def comparable(message: dict) -> dict:
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    return {"content": message["content"], "reasoning": message["reasoning"], "tool_calls": calls}


def assert_folds_to_the_parse(tokenizer: ChatTokenizer, ids: list[int], chunks: list[list[int]], finish: str,
                              stop: str | int | None, s: Settings) -> None:
    parsed, parsed_finish = chat_message(ids, finish, stop, tokenizer, s.tools, s.include_stop, s.opened)
    folded, folded_finish = fold(ReplyStream(tokenizer, s), chunks, finish, stop)
    assert comparable(folded) == comparable(parsed) and folded_finish == parsed_finish


def fixture_settings(name: str) -> Settings:
    body = request(name)
    stops = [body["stop"]] if isinstance(body.get("stop"), str) else body.get("stop") or []
    return Settings(ToolUse.of(body.get("tools"), body.get("tool_choice")), False, stops,
                    body.get("stop_token_ids") or [], bool(body.get("include_stop_str_in_output")))


@pytest.mark.parametrize("name", JSON_CASES + STREAM_CASES)
def test_fixture_fed_token_by_token_folds_to_the_parse(tokenizer: ChatTokenizer, name: str) -> None:
    ids, _, finish, stop = (streamed if name in STREAM_CASES else answered)(name)
    raw_finish = "stop" if finish == "tool_calls" else finish
    assert_folds_to_the_parse(tokenizer, ids, [[i] for i in ids], raw_finish, stop, fixture_settings(name))


def test_content_streams_before_the_reply_ends(tokenizer: ChatTokenizer) -> None:
    """Held back: a possible `<tool_call>` start, the whitespace before it; the call comes whole at the end."""
    stream = ReplyStream(tokenizer, Settings(ToolUse(parse=True)))
    ids = tokenizer.encode(f"Let me look.\n<tool_call>\n{CALL}\n</tool_call>")
    deltas = [stream.feed([i]) for i in ids]
    assert "".join(d.get("content", "") for d in deltas) == "Let me look."
    last, finish = stream.finish("stop", None)
    assert [c["function"]["name"] for c in last["tool_calls"]] == ["Bash"] and finish == "tool_calls"


def test_reasoning_streams_from_an_opened_prompt(tokenizer: ChatTokenizer) -> None:
    stream = ReplyStream(tokenizer, Settings(opened=True))
    sent = [stream.feed([i]) for i in tokenizer.encode("\nplan it\n</think>\n\nanswer")]
    assert "".join(d.get("reasoning", "") for d in sent) == "plan it"
    assert "".join(d.get("content", "") for d in sent) == "answer"


@st.composite
def replies(draw: st.DrawFn, tokenizer: ChatTokenizer) -> tuple[list[int], list[list[int]], Settings]:
    """A reply of random pieces, each tokenized whole, in pieces or byte by byte; chunks of random sizes."""
    ids: list[int] = []
    for piece in draw(st.lists(st.sampled_from(PIECES), max_size=14)):
        how = draw(st.sampled_from(["whole", "chars", "bytes"]))
        ids += (tokenizer.encode(piece) if how == "whole" or piece == "<|im_end|>"
                else byte_ids(piece, tokenizer) if how == "bytes"
                else [i for ch in piece for i in tokenizer.encode(ch)])
    cuts = sorted(draw(st.sets(st.integers(0, len(ids)), max_size=6)))
    chunks = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True)]
    tools = ToolUse(draw(st.booleans()), draw(st.booleans()))
    stops = draw(st.sampled_from([[], ["STOP"], ["</think>"]]))
    stop_ids = draw(st.sampled_from([[], tokenizer.encode(STOP_ID_TEXT)[-1:], [IM_END_ID]]))
    return ids, chunks, Settings(tools, draw(st.booleans()), stops, stop_ids, draw(st.booleans()))


def byte_ids(text: str, tokenizer: ChatTokenizer) -> list[int]:
    """The text as one token per byte (a character split over several tokens)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = bytes_to_unicode()
    return [tokenizer.hf.convert_tokens_to_ids(alphabet[b]) for b in text.encode()]


def stop_reason(ids: list[int], tokenizer: ChatTokenizer, s: Settings) -> str | int | None:
    """What the upstream would report: a stop token id at the end, else a stop string the text shows."""
    if ids and ids[-1] in s.stop_token_ids:
        return ids[-1]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return next((stop for stop in s.stops if stop in text), None)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), finish=st.sampled_from(["stop", "length"]))
def test_any_reply_fed_in_any_chunks_folds_to_the_parse(tokenizer: ChatTokenizer, data: st.DataObject,
                                                         finish: str) -> None:
    ids, chunks, s = data.draw(replies(tokenizer))
    assert_folds_to_the_parse(tokenizer, ids, chunks, finish, stop_reason(ids, tokenizer, s), s)


def test_calls_keep_their_arguments_json(tokenizer: ChatTokenizer) -> None:
    """A reply of calls only: no content delta at all, so it folds to None as the parse gives."""
    ids = tokenizer.encode(f"<tool_call>\n{CALL}\n</tool_call>")
    stream = ReplyStream(tokenizer, Settings(ToolUse(parse=True)))
    stream.feed(ids)
    last, finish = stream.finish("stop", None)
    assert "content" not in last and finish == "tool_calls"
    assert json.loads(last["tool_calls"][0]["function"]["arguments"]) == {"command": "ls"}
