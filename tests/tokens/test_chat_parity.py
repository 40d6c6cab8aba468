"""Parser parity: the sampled ids of every real vLLM chat fixture, parsed here, give vLLM's own message.

Each fixture's `token_ids` (or, for a stream, its chunks' ids) are decoded with the engine's Qwen3 tokenizer
and parsed with the request's tool settings; content, reasoning, tool calls (name, arguments) and the finish
reason must equal what vLLM's chat endpoint answered.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tracetap.engine.tokenizer import ChatTokenizer
from tracetap.tokens.message import ToolUse, chat_message

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"
NO_IDS = {"chat_max_tokens_clamped"}  # asked without return_token_ids: vLLM recorded no sampled ids
JSON_CASES = sorted(
    path.stem for path in FIXTURES.glob("chat_*.json")
    if not path.name.endswith((".request.json", ".prefix_check.json")) and path.stem not in NO_IDS
)
STREAM_CASES = sorted(path.stem for path in FIXTURES.glob("chat_*.sse"))


def request(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.request.json").read_text())["body"]


def answered(name: str) -> tuple[list[int], dict, str, str | int | None]:
    """(sampled ids, message, finish_reason, stop_reason) of a non-streamed fixture."""
    choice = json.loads((FIXTURES / f"{name}.json").read_text())["choices"][0]
    return choice["token_ids"], choice["message"], choice["finish_reason"], choice["stop_reason"]


def streamed(name: str) -> tuple[list[int], dict, str, str | int | None]:
    """The same four, reassembled from the stream's chunks (tool-call deltas merged by index)."""
    lines = (FIXTURES / f"{name}.sse").read_text().split("\n\n")
    choices = [c for e in lines if e.startswith("data: {") for c in json.loads(e[6:])["choices"]]
    ids, content, calls = [], None, {}
    for choice in choices:
        ids += choice.get("token_ids") or []
        delta = choice["delta"]
        if delta.get("content"):
            content = (content or "") + delta["content"]
        for call in delta.get("tool_calls") or []:
            merged = calls.setdefault(call["index"], {"type": "function", "function": {"arguments": ""}})
            merged["function"]["name"] = call.get("function", {}).get("name") or merged["function"].get("name")
            merged["function"]["arguments"] += call.get("function", {}).get("arguments") or ""
    message = {"content": content, "reasoning": None, "tool_calls": [calls[i] for i in sorted(calls)]}
    last = choices[-1]
    return ids, message, last["finish_reason"], last.get("stop_reason")


def comparable(message: dict) -> dict:
    """Content, reasoning and the calls without their random ids (vLLM drops an empty `tool_calls`)."""
    calls = [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"]))
             for c in message.get("tool_calls") or []]
    return {"content": message["content"], "reasoning": message.get("reasoning"), "tool_calls": calls}


def parse(name: str, ids: list[int], finish: str, stop: str | int | None, tokenizer: ChatTokenizer):
    """What the parser makes of the ids; the completions finish a chat `tool_calls` came from is `stop`."""
    body = request(name)
    raw_finish = "stop" if finish == "tool_calls" else finish
    return chat_message(
        ids, raw_finish, stop, tokenizer, ToolUse.of(body.get("tools"), body.get("tool_choice")),
        include_stop=bool(body.get("include_stop_str_in_output")),
    )


@pytest.mark.parametrize("name", JSON_CASES)
def test_parsed_ids_give_vllms_message(tokenizer: ChatTokenizer, name: str) -> None:
    ids, message, finish, stop = answered(name)
    parsed, parsed_finish = parse(name, ids, finish, stop, tokenizer)
    assert comparable(parsed) == comparable(message) and parsed_finish == finish


@pytest.mark.parametrize("name", STREAM_CASES)
def test_parsed_stream_ids_give_vllms_message(tokenizer: ChatTokenizer, name: str) -> None:
    ids, message, finish, stop = streamed(name)
    parsed, parsed_finish = parse(name, ids, finish, stop, tokenizer)
    # deltas cannot tell an empty content from none (an empty one is never sent), so neither side does here
    parsed["content"], message["content"] = parsed["content"] or "", message["content"] or ""
    assert comparable(parsed) == comparable(message) and parsed_finish == finish


def test_every_chat_fixture_is_covered() -> None:
    """A new fixture joins the parity run by its name; the one without ids really has none."""
    assert len(JSON_CASES) >= 16 and len(STREAM_CASES) >= 4
    for name in NO_IDS:
        assert answered(name)[0] is None
