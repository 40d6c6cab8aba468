"""`--tokenize gateway` streaming (`TokenizingUpstream.chat_stream`) against a real embedded engine.

Each scripted reply is asked for twice in fresh sessions, whole (`chat`) and streamed; the streamed chunks,
folded, must be the same answer: prompt and sampled ids, logprobs, message, finish and stop reasons. Text
must arrive before the stream ends, a completed stream continues the session's tokens, one stopped early
is partial and not continued.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import live
import pytest
from live import Plan, fixture_body
from tracetap.capture import sse
from tracetap.capture.tokenizing import TokenizingUpstream
from tracetap.capture.upstream import UpstreamClient, UpstreamError, UpstreamResult
from tracetap.engine.server import EngineServer
from tracetap.engine.tokenizer import load_tokenizer

COMMAND = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS = [{"type": "function", "function": {"name": "Bash", "description": "Run.", "parameters": COMMAND}}]
SSE = {"content-type": "text/event-stream"}
COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")  # a whole body's usage adds null details
QUESTION = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is here?"}]


def bash(command: str) -> dict:
    return {"function": {"name": "Bash", "arguments": {"command": command}}}


SCRIPT = [
    {"content": "Let me look.", "tool_calls": [bash("ls")], "tokens": "split"},
    {"content": "Two files: a.py and b.py, both 日本語 free.", "reasoning": "The listing\nshows two.",
     "tokens": "split"},
    {"content": "Plain words, said the canonical way."},
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tracetap_home) -> Iterator[EngineServer]:
    script = live.write_script(tmp_path_factory.mktemp("script") / "replies.jsonl", SCRIPT)
    with EngineServer(script=script, served_model="scripted-tiny") as running:
        yield running


async def upstream(engine: EngineServer) -> TokenizingUpstream:
    """The gateway's upstream; `discover` learns the context length (the default room for the reply)."""
    gw = TokenizingUpstream(UpstreamClient(engine.url), load_tokenizer())
    await gw.discover()
    return gw


async def stream_all(gw: TokenizingUpstream, request: dict, session: str, completion: str | None = None,
                     stop_after: int | None = None) -> tuple[list[dict], UpstreamResult]:
    """(chunks, result) of one streamed call; `stop_after` chunks then aclose."""
    stream = await gw.chat_stream(request, session, completion)
    chunks: list[dict] = []
    try:
        async for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == stop_after:
                break
    finally:
        await stream.aclose()
    return chunks, stream.result()


def both(engine: EngineServer, name: str, request: dict,
         turns: int) -> tuple[UpstreamResult, list[dict], UpstreamResult]:
    """The `turns`-th reply of two new sessions, whole and streamed (earlier turns are asked whole in both)."""
    async def run():
        gw = await upstream(engine)
        try:
            for _ in range(turns - 1):
                await gw.chat(request, f"{name}-whole"), await gw.chat(request, f"{name}-streamed")
            whole = await gw.chat(request, f"{name}-whole")
            chunks, streamed = await stream_all(gw, request, f"{name}-streamed")
            return whole, chunks, streamed
        finally:
            await gw.aclose()

    return asyncio.run(run())


def answer(result: UpstreamResult) -> dict:
    """What must match between a whole and a streamed call (tool-call ids are made up per call)."""
    choice = result.body["choices"][0]
    message = choice["message"]
    calls = [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"]))
             for c in message.get("tool_calls") or []]
    return {"prompt": result.body["prompt_token_ids"], "ids": choice["token_ids"], "logprobs": choice["logprobs"],
            "content": message["content"], "reasoning": message.get("reasoning"), "calls": calls,
            "finish": choice["finish_reason"], "stop": choice["stop_reason"],
            "usage": {key: result.body["usage"][key] for key in COUNTS}}


# name: (request fields, which scripted turn, what the whole answer shows)
CASES = {
    "tool call, split tokens": ({"tools": TOOLS}, 1, {"finish": "tool_calls", "content": "Let me look."}),
    "reasoning, split tokens": ({"tools": TOOLS}, 2, {"finish": "stop", "reasoning": "The listing\nshows two."}),
    "plain text": ({}, 3, {"finish": "stop", "content": SCRIPT[2]["content"]}),
    "cut by length": ({"max_tokens": 7}, 2, {"finish": "length", "content": None}),
    "top logprobs": ({"logprobs": True, "top_logprobs": 2}, 3, {"finish": "stop"}),
    "tools switched off": ({"tools": TOOLS, "tool_choice": "none"}, 1, {"finish": "stop", "calls": []}),
}


@pytest.mark.parametrize("name", CASES)
def test_folded_stream_is_the_whole_answer(engine: EngineServer, name: str) -> None:
    extra, turn, shows = CASES[name]
    session = name.replace(" ", "-").replace(",", "")
    whole, chunks, streamed = both(engine, session, {"model": "m", "messages": QUESTION, **extra}, turn)
    assert {key: answer(whole)[key] for key in shows} == shows
    assert answer(streamed) == answer(whole) and not streamed.partial
    assert streamed.metadata == whole.metadata and streamed.metadata["tokenization"] == "gateway"
    assert streamed.request == whole.request and streamed.request_json == whole.request_json
    assert streamed.capture.problems == [] and streamed.capture.completion_token_ids == answer(whole)["ids"]
    assert [i for c in chunks for part in c["choices"] for i in part["token_ids"]] == answer(whole)["ids"]


@pytest.mark.parametrize("kept", [False, True])
def test_a_stop_string_is_cut_as_in_the_whole_answer(tracetap_home, kept: bool) -> None:
    """A sampling engine (the scripted one plays its lines whatever the stops): seeded, both calls sample the
    same ids; the stop string is held back while it may be forming, then cut (or kept) as the parse does."""
    request = {"model": "m", "messages": QUESTION, "stop": ["e"], "include_stop_str_in_output": kept,
               "max_tokens": 40, "temperature": 1.0, "seed": 4}
    with EngineServer(seed=0) as sampling:
        whole, _, streamed = both(sampling, f"stop-{kept}", request, 1)
    assert answer(whole)["stop"] == "e" and answer(whole)["content"].endswith("e") == kept
    assert answer(streamed) == answer(whole)


def test_text_arrives_before_the_last_token(engine: EngineServer) -> None:
    _, chunks, streamed = both(engine, "early-text", {"model": "m", "messages": QUESTION}, 3)
    texts = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert len([t for t in texts if t]) > 3 and texts[0] is not None
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and "prompt_token_ids" in chunks[0]
    assert "".join(t for t in texts if t) == streamed.body["choices"][0]["message"]["content"]


def test_streamed_turns_continue_the_session_with_zero_drift(engine: EngineServer) -> None:
    """Turn 1 (a tool call sampled in pieces) streamed, its folded message sent back: turn 2's prompt is turn 1's
    prompt + its sampled ids verbatim, and the metadata says it continued turn 1."""
    async def run():
        gw = await upstream(engine)
        try:
            request = {"model": "m", "messages": list(QUESTION), "tools": TOOLS}
            _, first = await stream_all(gw, request, "multi", "c1")
            message = first.body["choices"][0]["message"]
            call_id = message["tool_calls"][0]["id"]
            request["messages"] += [{k: v for k, v in message.items() if v is not None},
                                    {"role": "tool", "tool_call_id": call_id, "content": "a.py\nb.py"}]
            _, second = await stream_all(gw, request, "multi", "c2")
            return first, second
        finally:
            await gw.aclose()

    first, second = asyncio.run(run())
    sampled = first.capture.prompt_token_ids + first.capture.completion_token_ids
    assert second.capture.prompt_token_ids[: len(sampled)] == sampled
    assert second.metadata["continues"] == "c1"
    assert second.metadata["added_tokens"] == len(second.capture.prompt_token_ids) - len(sampled)


def test_a_stream_stopped_early_is_partial_and_not_continued(engine: EngineServer) -> None:
    async def run():
        gw = await upstream(engine)
        try:
            request = {"model": "m", "messages": list(QUESTION)}
            chunks, stopped = await stream_all(gw, request, "early", "c1", stop_after=3)
            again = gw.continuity.prompt("early", gw._render(request))
            return chunks, stopped, again
        finally:
            await gw.aclose()

    chunks, stopped, again = asyncio.run(run())
    assert stopped.partial and len(stopped.capture.completion_token_ids) == 3
    assert stopped.body["choices"][0]["finish_reason"] is None and again.retry_of is None


def test_real_vllm_completions_chunks_become_chat_chunks(stub_upstream) -> None:
    """vLLM 0.32's own `/v1/completions` stream (replayed by the stub) read as a chat stream."""
    async def run():
        gw = TokenizingUpstream(UpstreamClient(stub_upstream.url), load_tokenizer())
        try:
            return await stream_all(gw, {"model": "tiny", "messages": QUESTION}, "completions_tokens_stream")
        finally:
            await gw.aclose()

    chunks, result = asyncio.run(run())
    real = [json.loads(d) for d in sse.payloads(fixture_body("completions_tokens_stream").decode()) if d != sse.DONE]
    assert [c["choices"][0]["token_ids"] for c in chunks[:-1]] == [c["choices"][0]["token_ids"] for c in real[:-1]]
    assert chunks[0]["prompt_token_ids"] == real[0]["choices"][0]["prompt_token_ids"]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    choice = result.body["choices"][0]
    assert choice["message"]["content"] == "\n\n\n\n" and choice["finish_reason"] == "length"
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [
        c["choices"][0]["logprobs"]["token_logprobs"][0] for c in real[:-1]]
    assert result.body["usage"] == real[-1]["usage"] and not result.partial and result.capture.problems == []


def test_an_error_mid_stream_keeps_the_gateway_metadata(stub_upstream) -> None:
    head = fixture_body("completions_tokens_stream").split(b"\n\n")[:2]
    error = b'data: {"error": {"message": "engine died", "code": 500}}'
    stub_upstream.plans["dies"] = Plan(answer=lambda _: (200, b"\n\n".join([*head, error, b""]), SSE))

    async def run():
        gw = TokenizingUpstream(UpstreamClient(stub_upstream.url), load_tokenizer())
        stream = await gw.chat_stream({"model": "tiny", "messages": QUESTION}, "dies", "c1")
        seen = []
        try:
            with pytest.raises(UpstreamError) as raised:
                async for chunk in stream:
                    seen.append(chunk)
            return raised.value, seen, stream.result()
        finally:
            await gw.aclose()

    error, seen, result = asyncio.run(run())
    assert (error.kind, error.status) == ("http", 500) and error.metadata["tokenization"] == "gateway"
    assert len(seen) == 2 and result.partial and result.capture.completion_token_ids == [198, 198]
