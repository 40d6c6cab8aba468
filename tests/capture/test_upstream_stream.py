"""The streamed upstream call (`UpstreamClient.chat_stream`, `open_sse`) over loopback.

A stub replays the real vLLM 0.32.0 stream fixtures (and misbehaving streams); the embedded engine
checks that a streamed call folds into exactly what the whole call returns.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from live import ERROR_FIXTURES, INDEX, Plan, fixture_body, fixture_capture, free_port
from tracetap.capture import sse
from tracetap.capture.upstream import UpstreamClient, UpstreamError, with_token_flags
from tracetap.engine.server import EngineServer

STREAMS = ["chat_stream", "chat_stream_eos", "chat_stream_tools", "chat_stream_tools_named"]
SSE = {"content-type": "text/event-stream"}


def chunks_of(name: str) -> list[dict]:
    return [json.loads(d) for d in sse.payloads(fixture_body(name).decode()) if d != sse.DONE]


def streamed(client: UpstreamClient, session: str | None, stop_after: int | None = None):
    """(chunks read, result) of one streamed call; `stop_after` chunks then aclose."""
    async def run():
        try:
            stream = await client.chat_stream({"model": "tiny", "messages": []}, session)
            seen = []
            try:
                async for chunk in stream:
                    seen.append(chunk)
                    if len(seen) == stop_after:
                        break
            finally:
                await stream.aclose()
            return seen, stream.result()
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_stream_flags_come_from_the_one_flag_function():
    sent = with_token_flags({"messages": [], "stream_options": {"include_usage": False}}, stream=True)
    assert sent["stream"] is True and sent["return_token_ids"] is True and sent["logprobs"] is True
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert "stream_options" not in with_token_flags({"messages": [], "stream_options": {}})


@pytest.mark.parametrize("name", STREAMS)
def test_chunks_pass_as_sent_and_fold_like_the_whole_stream(stub_upstream, name):
    seen, result = streamed(UpstreamClient(stub_upstream.url), name)
    assert seen == chunks_of(name)
    expected = fixture_capture(name)
    assert not result.partial and result.capture.problems == []
    assert result.capture.prompt_token_ids == expected.prompt_token_ids
    assert result.capture.completion_token_ids == expected.completion_token_ids
    assert result.capture.logprobs == expected.logprobs
    assert result.capture.tool_calls == expected.tool_calls
    assert result.request["stream"] is True and json.loads(result.request_json) == result.request


def test_stopping_early_keeps_the_tokens_so_far_as_partial(stub_upstream):
    seen, result = streamed(UpstreamClient(stub_upstream.url), "chat_stream", stop_after=4)
    assert result.partial and len(seen) == 4
    assert result.capture.prompt_token_ids == fixture_capture("chat_stream").prompt_token_ids
    assert result.capture.completion_token_ids == [198, 198, 198]  # the first chunk samples nothing
    assert len(result.capture.logprobs) == 3 and result.capture.finish_reason is None


@pytest.mark.parametrize("name", ERROR_FIXTURES[:3])
def test_an_http_error_before_the_stream_raises_with_its_status(stub_upstream, name):
    with pytest.raises(UpstreamError) as error:
        streamed(UpstreamClient(stub_upstream.url), name)
    assert (error.value.kind, error.value.status) == ("http", INDEX[name]["status"])
    assert error.value.body == json.loads(fixture_body(name)) and error.value.request["stream"] is True


def test_an_answer_that_is_no_stream_is_invalid(stub_upstream):
    with pytest.raises(UpstreamError) as error:
        streamed(UpstreamClient(stub_upstream.url), "chat_basic")
    assert (error.value.kind, error.value.status) == ("invalid", 502)


def test_an_error_in_the_stream_keeps_the_chunks_before_it(stub_upstream):
    head = fixture_body("chat_stream").split(b"\n\n")[:3]
    error = b'data: {"error": {"message": "engine died", "code": 500}}'
    stub_upstream.plans["dies"] = Plan(answer=lambda _: (200, b"\n\n".join([*head, error, b""]), SSE))
    with pytest.raises(UpstreamError) as raised:
        streamed(UpstreamClient(stub_upstream.url), "dies")
    assert (raised.value.kind, raised.value.status, str(raised.value)) == ("http", 500, "engine died")


def test_a_stream_cut_before_done_is_an_error(stub_upstream):
    cut = fixture_body("chat_stream").split(b"data: [DONE]")[0]
    stub_upstream.plans["cut"] = Plan(answer=lambda _: (200, cut, SSE))
    with pytest.raises(UpstreamError) as raised:
        streamed(UpstreamClient(stub_upstream.url), "cut")
    assert raised.value.kind == "unreachable" and "before [DONE]" in str(raised.value)


def test_a_line_over_the_bound_is_refused():
    decoder = sse.SSEDecoder(max_line=16)
    assert decoder.feed(b"data: 1\n\ndata: ") == ["1"]
    with pytest.raises(sse.SSEError):
        decoder.feed(b"x" * 17)


def test_sse_decoder_joins_pieces_and_a_last_line_without_newline():
    decoder = sse.SSEDecoder()
    pieces = [decoder.feed(bytes([b])) for b in b'data: {"a": 1}\r\n\n: comment\ndata: [DONE]']
    assert [p for got in pieces for p in got] + decoder.finish() == ['{"a": 1}', "[DONE]"]


def test_unreachable_before_the_stream():
    with pytest.raises(UpstreamError) as error:
        streamed(UpstreamClient(f"http://127.0.0.1:{free_port()}"), None)
    assert (error.value.kind, error.value.status) == ("unreachable", 502)


def test_streamed_and_whole_calls_of_the_embedded_engine_capture_the_same_tokens():
    request = {"model": "tracetap-tiny", "messages": [{"role": "user", "content": "hello there"}],
               "max_tokens": 12, "temperature": 0}

    async def both(url: str):
        client = UpstreamClient(url)
        try:
            whole = await client.chat(request)
            stream = await client.chat_stream(request)
            chunks = [chunk async for chunk in stream]
            return whole, stream.result(), chunks
        finally:
            await client.aclose()

    with EngineServer() as engine:
        whole, result, chunks = asyncio.run(both(engine.url))
    assert len(chunks) > 2 and not result.partial
    for key in ("prompt_token_ids", "completion_token_ids", "logprobs", "finish_reason"):
        assert getattr(result.capture, key) == getattr(whole.capture, key), key
    assert result.body["choices"][0]["message"]["content"] == whole.body["choices"][0]["message"]["content"]
