"""Key-compare: the engine's bodies have the same keys as real vLLM 0.32 responses, at every level.

Each case sends the fixture's own request to the engine and compares the key sets level by level.
Known differences are listed in ALLOWED with a reason.
"""

from __future__ import annotations

import json

import httpx
import pytest
from tracetap.engine.server import EngineServer

# (fixture, path inside the body) -> why the engine's keys differ there
ALLOWED: dict[tuple[str, str], str] = {
    (name, "choices[].logprobs.top_logprobs[]"): "the legacy top dicts are keyed by token text; other weights"
    for name in ("completions_tokens", "completions_text", "completions_sampled_top2")
}


def shape(value, path: str = "", into: dict | None = None) -> dict[str, frozenset]:
    """Every dict's key set, by path (`choices[].message`), merged over list items."""
    into = {} if into is None else into
    if isinstance(value, dict):
        into[path] = into.get(path, frozenset()) | frozenset(value)
        for key, item in value.items():
            shape(item, f"{path}.{key}" if path else key, into)
    elif isinstance(value, list):
        for item in value:
            shape(item, f"{path}[]", into)
    return into


def assert_same_shape(name: str, ours, theirs) -> None:
    mine, real = shape(ours), shape(theirs)
    differing = {
        path: (sorted(mine.get(path, ())), sorted(real.get(path, ())))
        for path in mine.keys() | real.keys()
        if mine.get(path) != real.get(path) and (name, path) not in ALLOWED
    }
    assert not differing, f"{name}: keys differ from vLLM's (engine, vLLM): {differing}"


def send(server: EngineServer, request: dict) -> httpx.Response:
    body = request["raw_body"].encode() if "raw_body" in request else json.dumps(request.get("body")).encode()
    return httpx.request(request["method"], f"{server.url}{request['path']}", content=body)


SAMPLED_CASES = [
    "chat_basic", "chat_top2", "chat_sampled_top3", "chat_history", "chat_length", "models", "tokenize_chat",
    "tokenize_chat_token_strs", "tokenize_prompt", "error_missing_messages", "error_max_tokens_overflow",
    "error_context_overflow", "error_unknown_tool_choice", "error_invalid_json",
    "completions_tokens", "completions_text", "completions_sampled_top2",
]


@pytest.mark.parametrize("name", SAMPLED_CASES)
def test_sampled_engine_keys_match_vllm(server: EngineServer, vllm, name: str) -> None:
    response = send(server, vllm(f"{name}.request"))
    assert response.status_code == vllm("index")[name]["status"]
    assert_same_shape(name, response.json(), vllm(name))


def test_tool_call_keys_match_vllm(scripted: EngineServer, vllm) -> None:
    """A parsed auto tool call (the script's first line) against chat_tools_auto_call."""
    body = vllm("chat_tools_auto_call.request")
    response = send(scripted, body).json()
    assert response["choices"][0]["finish_reason"] == "tool_calls"
    assert_same_shape("chat_tools_auto_call", response, vllm("chat_tools_auto_call"))


def test_stream_chunk_keys_match_vllm(scripted: EngineServer, vllm) -> None:
    """A stream that ends on <|im_end|> against chat_stream_eos: role, token, finishing and usage chunks."""
    body = {**vllm("chat_stream_eos.request")["body"], "max_tokens": None}  # the whole scripted reply
    raw = httpx.post(f"{scripted.url}/v1/chat/completions", json=body).text
    ours, theirs = kinds(raw), kinds(vllm.text("chat_stream_eos.sse"))
    assert ours.keys() == theirs.keys()
    for kind in theirs:
        assert_same_shape(f"chat_stream_eos:{kind}", ours[kind], theirs[kind])


def kinds(sse: str) -> dict[str, list]:
    """Chunks grouped as vLLM sends them: role, tokens, finish, usage."""
    chunks = [json.loads(event[6:]) for event in sse.split("\n\n") if event.startswith("data: {")]
    groups: dict[str, list] = {"role": [chunks[0]], "usage": [chunks[-1]], "tokens": [], "finish": []}
    for chunk in chunks[1:-1]:
        groups["finish" if chunk["choices"][0]["finish_reason"] else "tokens"].append(chunk)
    return groups



def test_completions_stream_chunk_keys_match_vllm(server: EngineServer, vllm) -> None:
    """The first token chunk (with the prompt ids; `kinds` files it as "role"), the other token chunks,
    the finishing chunk and the usage chunk."""
    body = vllm("completions_tokens_stream.request")["body"]
    raw = httpx.post(f"{server.url}/v1/completions", json=body).text
    ours, theirs = kinds(raw), kinds(vllm.text("completions_tokens_stream.sse"))
    assert ours.keys() == theirs.keys() and len(ours["tokens"]) == len(theirs["tokens"]) == 2
    allowed = {path for (name, path) in ALLOWED if name == "completions_tokens"}
    for kind in theirs:
        mine, real = shape(ours[kind]), shape(theirs[kind])
        assert {p: k for p, k in mine.items() if p.removeprefix("[].") not in allowed} == {
            p: k for p, k in real.items() if p.removeprefix("[].") not in allowed}, kind
