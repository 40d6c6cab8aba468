"""The upstream client and its parsers against every real vLLM 0.32.0 chat fixture.

Pure parsing is checked field by field against the fixture bodies; the client itself talks HTTP to a
stub on loopback that replays the fixtures (errors keep their status), to a closed port (502) and to
a slow answer (504).
"""

from __future__ import annotations

import asyncio
import json
import math
import re

import pytest
from live import CHAT_FIXTURES, ERROR_FIXTURES, INDEX, Plan, StubUpstream, fixture_body, free_port
from tracetap.capture.upstream import (
    NO_CHOICES,
    STREAMED,
    InvalidAnswer,
    UpstreamClient,
    UpstreamError,
    parse_chat_response,
    parse_chat_stream,
    sglang_to_vllm,
    with_token_flags,
)

JSON_FIXTURES = [n for n in CHAT_FIXTURES if INDEX[n]["response_file"].endswith(".json")]
SSE_FIXTURES = [n for n in CHAT_FIXTURES if INDEX[n]["response_file"].endswith(".sse")]
GENERATION_PROMPT = [151644, 77091, 198]  # <|im_start|>assistant\n
TOKEN_KEYS = {"prompt_token_ids", "token_ids", "logprobs"}


def body_of(name: str) -> dict:
    return json.loads(fixture_body(name))


def chunks_of(name: str) -> list[dict]:
    lines = fixture_body(name).decode().splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def keys_anywhere(value: object) -> set[str]:
    if isinstance(value, dict):
        return set(value) | set().union(*(keys_anywhere(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(keys_anywhere(v) for v in value)) if value else set()
    return set()


def test_every_chat_fixture_is_covered():
    assert (len(JSON_FIXTURES), len(SSE_FIXTURES), len(ERROR_FIXTURES)) == (17, 4, 10)


@pytest.mark.parametrize("name", JSON_FIXTURES)
def test_json_fixture_fields(name):
    body = body_of(name)
    choice = body["choices"][0]
    capture = parse_chat_response(body)
    assert capture.prompt_token_ids == body["prompt_token_ids"]
    assert capture.completion_token_ids == choice["token_ids"]
    assert capture.finish_reason == choice["finish_reason"]
    assert capture.stop_reason == choice["stop_reason"]
    assert capture.prompt_tokens == body["usage"]["prompt_tokens"]
    assert capture.completion_tokens == body["usage"]["completion_tokens"]
    calls = choice["message"].get("tool_calls") or []
    assert capture.tool_calls == [{"id": c["id"], "name": c["function"]["name"],
                                   "arguments": c["function"]["arguments"]} for c in calls]
    if capture.completion_token_ids is None:
        assert capture.logprobs is None and capture.top_logprobs is None
    else:
        assert capture.logprobs == [e["logprob"] for e in choice["logprobs"]["content"]]
        assert len(capture.logprobs) == len(capture.completion_token_ids) == capture.completion_tokens
        assert capture.prompt_token_ids[-3:] == GENERATION_PROMPT
    assert not keys_anywhere(capture.body) & TOKEN_KEYS
    assert capture.body["choices"][0]["message"] == choice["message"]


@pytest.mark.parametrize(("name", "finish", "stop_reason", "last_id"), [
    ("chat_eos", "stop", None, 151645),
    ("chat_stop", "stop", " Unfortunately", None),
    ("chat_stop_token_ids", "stop", 198, 198),
    ("chat_length", "length", None, None),
    ("chat_tools_auto_call", "tool_calls", None, 151645),
])
def test_stop_kinds(name, finish, stop_reason, last_id):
    capture = parse_chat_response(body_of(name))
    assert (capture.finish_reason, capture.stop_reason) == (finish, stop_reason)
    if last_id is not None:
        assert capture.completion_token_ids[-1] == last_id


def test_tool_call_fixture():
    capture = parse_chat_response(body_of("chat_tools_auto_call"))
    [call] = capture.tool_calls
    assert call["name"] == "Bash" and json.loads(call["arguments"]) == {"command": "ls -la"}
    assert call["id"].startswith("chatcmpl-tool-")


def test_no_token_ids_means_no_logprobs():
    """chat_max_tokens_clamped was asked without return_token_ids: nothing to align the logprobs with."""
    body = body_of("chat_max_tokens_clamped")
    assert body["prompt_token_ids"] is None
    capture = parse_chat_response(body)
    assert capture.prompt_token_ids is None and capture.logprobs is None


@pytest.mark.parametrize(("name", "k"), [("chat_top2", 2), ("chat_sampled_top3", 3)])
def test_top_logprobs(name, k):
    capture = parse_chat_response(body_of(name))
    assert len(capture.top_logprobs) == len(capture.completion_token_ids)
    assert all(len(alternatives) == k for alternatives in capture.top_logprobs)
    first = body_of(name)["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]
    expected = {"token_id": None, "token": first["token"], "logprob": first["logprob"]}
    assert capture.top_logprobs[0][0] == expected


def test_tokens_as_ids_fill_top_logprob_ids():
    capture = parse_chat_response(body_of("chat_tokens_as_ids"))
    top = [t for alternatives in capture.top_logprobs or [] for t in alternatives]
    assert top and all(isinstance(t["token_id"], int) for t in top)


def test_unaligned_logprobs_are_dropped_whole():
    body = body_of("chat_basic")
    body["choices"][0]["logprobs"]["content"].pop()
    capture = parse_chat_response(body)
    assert capture.completion_token_ids == body["choices"][0]["token_ids"] and capture.logprobs is None
    n = len(capture.completion_token_ids)
    assert capture.problems == [f"upstream sent {n - 1} logprobs for {n} sampled tokens"]


def mutated(change) -> dict:
    body = body_of("chat_tools_auto_call")
    change(body, body["choices"][0])
    return body


def _set(target: str, key: str, value: object):
    def change(body: dict, choice: dict) -> None:
        where = {"body": body, "choice": choice, "message": choice["message"], "usage": body["usage"],
                 "call": choice["message"]["tool_calls"][0]}[target]
        where[key] = value
    return change


UNUSABLE = {  # the answers that once made the gateway fail to record the call
    "token_ids_strings": (_set("choice", "token_ids", ["a"]), "choices[0].token_ids"),
    "token_ids_null_entry": (_set("choice", "token_ids", [None, 1]), "choices[0].token_ids"),
    "token_ids_beyond_int32": (_set("choice", "token_ids", [2**40]), "choices[0].token_ids"),
    "token_ids_negative": (_set("choice", "token_ids", [-1]), "choices[0].token_ids"),
    "token_ids_bools": (_set("choice", "token_ids", [True]), "choices[0].token_ids"),
    "prompt_ids_object": (_set("body", "prompt_token_ids", {"a": 1}), "prompt_token_ids"),
    "tool_calls_not_objects": (_set("message", "tool_calls", ["Bash"]), "tool_calls"),
    "tool_call_function_text": (_set("call", "function", "Bash"), "tool_calls[0].function"),
    "finish_reason_object": (_set("choice", "finish_reason", {"why": "stop"}), "finish_reason"),
    "usage_words": (_set("usage", "prompt_tokens", "many"), "usage.prompt_tokens"),
    "usage_details_list": (_set("usage", "prompt_tokens_details", [1]), "usage.prompt_tokens_details"),
    "content_object": (_set("message", "content", {"text": "hi"}), "choices[0].message.content"),
    "choices_object": (_set("body", "choices", {"0": {}}), "choices"),
    "model_number": (_set("body", "model", 7), "model"),
    "stop_reason_list": (_set("choice", "stop_reason", [1]), "stop_reason"),
}


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_unusable_answers_raise_naming_the_field(case):
    change, field = UNUSABLE[case]
    with pytest.raises(InvalidAnswer, match=re.escape(field)):
        parse_chat_response(mutated(change))


def _drop(target: str, key: str):
    def change(body: dict, choice: dict) -> None:
        {"body": body, "choice": choice}[target].pop(key)
    return change


@pytest.mark.parametrize(("change", "problems"), [
    (_drop("choice", "token_ids"), ["upstream sent no completion token_ids"]),
    (_drop("body", "prompt_token_ids"), ["upstream sent no prompt_token_ids"]),
    (_set("body", "choices", []), [NO_CHOICES]),
    (lambda body, choice: choice["logprobs"]["content"].pop(0), ["upstream sent 49 logprobs for 50 sampled tokens"]),
    (lambda body, choice: choice["logprobs"]["content"][3].update(logprob="x"),
     ["upstream logprobs are not all numbers"]),
    (lambda body, choice: choice["logprobs"]["content"][3].update(logprob=True),
     ["upstream logprobs are not all numbers"]),
    (lambda body, choice: choice["logprobs"]["content"].__setitem__(3, ["not an entry"]),
     ["upstream logprobs are not a list of entries"]),
])
def test_answers_without_training_data_name_their_problems(change, problems):
    capture = parse_chat_response(mutated(change))
    assert capture.problems == problems
    assert capture.logprobs is None or len(capture.logprobs) == len(capture.completion_token_ids)


def test_good_answers_have_no_problems():
    assert all(not parse_chat_response(body_of(n)).problems for n in JSON_FIXTURES if n != "chat_max_tokens_clamped")


def test_malformed_sglang_fields_are_unusable():
    body = {"choices": [{"message": {"content": "x"}, "meta_info": {"output_token_logprobs": [[-0.1, "a", "x"]]}}]}
    with pytest.raises(InvalidAnswer, match="SGLang"):
        parse_chat_response(body, kind="sglang")


@pytest.mark.parametrize("name", SSE_FIXTURES)
def test_stream_fixture_fields(name):
    chunks = chunks_of(name)
    capture = parse_chat_stream(fixture_body(name).decode())
    choices = [ch for c in chunks for ch in c["choices"]]
    ids = [i for ch in choices for i in ch.get("token_ids") or []]
    logprobs = [e["logprob"] for ch in choices for e in (ch.get("logprobs") or {}).get("content") or []]
    assert capture.prompt_token_ids == chunks[0]["prompt_token_ids"]
    assert capture.completion_token_ids == ids and capture.logprobs == logprobs and len(ids) == len(logprobs)
    assert capture.finish_reason == next(ch["finish_reason"] for ch in choices if ch["finish_reason"])
    assert capture.completion_tokens == chunks[-1]["usage"]["completion_tokens"] == len(ids)


@pytest.mark.parametrize(("stream", "plain", "n"), [
    ("chat_stream_tools", "chat_tools_auto_call", None),
    ("chat_stream", "chat_basic", 8),
])
def test_stream_equals_plain_call(stream, plain, n):
    streamed = parse_chat_stream(fixture_body(stream).decode())
    whole = parse_chat_response(body_of(plain))
    assert streamed.prompt_token_ids == whole.prompt_token_ids
    assert streamed.completion_token_ids == whole.completion_token_ids[:n]
    pairs = zip(streamed.logprobs, whole.logprobs, strict=False)
    assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in pairs)
    assert [c["name"] for c in streamed.tool_calls] == [c["name"] for c in whole.tool_calls]


def test_streamed_tool_call_arguments_concatenate():
    [call] = parse_chat_stream(fixture_body("chat_stream_tools_named").decode()).tool_calls
    assert call["name"] == "Bash" and json.loads(call["arguments"]) == {"command": "id"}


@pytest.mark.parametrize(("request_body", "kind", "expected"), [
    ({"model": "m", "stream": True, "stream_options": {"include_usage": True}}, "vllm",
     {"model": "m", "stream": False, "logprobs": True, "top_logprobs": 0, "return_token_ids": True}),
    ({"logprobs": True, "top_logprobs": 3}, "vllm",
     {"stream": False, "logprobs": True, "top_logprobs": 3, "return_token_ids": True}),
    ({"logprobs": False, "top_logprobs": 3}, "vllm",
     {"stream": False, "logprobs": True, "top_logprobs": 0, "return_token_ids": True}),
    ({"logprobs": True, "top_logprobs": 2}, "sglang",
     {"stream": False, "logprobs": True, "top_logprobs": 2, "return_prompt_token_ids": True,
      "return_meta_info": True}),
])
def test_token_flags(request_body, kind, expected):
    assert with_token_flags(request_body, kind) == expected


def test_sglang_answer_maps_to_vllm_fields():
    vllm = body_of("chat_top2")
    choice = vllm["choices"][0]
    entries = choice["logprobs"]["content"]
    sglang = json.loads(json.dumps(vllm))
    del sglang["prompt_token_ids"]
    sg_choice = sglang["choices"][0]
    del sg_choice["token_ids"]
    sg_choice["logprobs"] = {"content": entries[:3]}  # SGLang may truncate this list
    sg_choice["prompt_token_ids"] = vllm["prompt_token_ids"]
    sg_choice["message"]["reasoning_content"] = "thinking"
    sg_choice["meta_info"] = {
        "output_token_logprobs": [[e["logprob"], i, e["token"]]
                                  for e, i in zip(entries, choice["token_ids"], strict=True)],
        "output_top_logprobs": [[[t["logprob"], 7, t["token"]] for t in e["top_logprobs"]] for e in entries],
        "e2e_latency": 0.5,
    }
    capture = parse_chat_response(sglang, kind="sglang")
    expected = parse_chat_response(vllm)
    assert capture.prompt_token_ids == expected.prompt_token_ids
    assert capture.completion_token_ids == expected.completion_token_ids
    assert capture.logprobs == expected.logprobs
    assert [[t["token_id"] for t in alt] for alt in capture.top_logprobs] == [[7, 7]] * len(entries)
    assert sglang_to_vllm(sglang)["choices"][0]["message"]["reasoning"] == "thinking"
    assert capture.body["choices"][0]["meta_info"] == {"e2e_latency": 0.5}


def call(client: UpstreamClient, request: dict, session: str | None = None):
    async def run():
        try:
            return await client.chat(request, session)
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_client_sends_token_flags_and_session(stub_upstream):
    result = call(UpstreamClient(stub_upstream.url + "/v1"), {"model": "tiny", "messages": []}, "run-1")
    headers, sent = stub_upstream.requests[-1]
    assert headers["x-tracetap-session"] == "run-1"
    assert sent == result.request == {"model": "tiny", "messages": [], "stream": False, "logprobs": True,
                                      "top_logprobs": 0, "return_token_ids": True}
    assert result.capture.completion_token_ids == body_of("chat_basic")["choices"][0]["token_ids"]


def test_client_folds_a_streamed_answer(stub_upstream):
    result = call(UpstreamClient(stub_upstream.url), {"messages": []}, "chat_stream_tools")
    assert result.capture.tool_calls[0]["name"] == "Bash"
    assert result.capture.problems == [STREAMED]  # a stream was not what the gateway asked for
    plain = parse_chat_response(body_of("chat_tools_auto_call"))
    assert result.capture.completion_token_ids == plain.completion_token_ids


@pytest.mark.parametrize("name", ERROR_FIXTURES)
def test_client_keeps_error_status_and_body(stub_upstream, name):
    with pytest.raises(UpstreamError) as error:
        call(UpstreamClient(stub_upstream.url), {"messages": []}, name)
    assert error.value.kind == "http"
    assert error.value.status == INDEX[name]["status"]
    assert error.value.body == body_of(name)
    assert str(error.value) == body_of(name)["error"]["message"]
    assert error.value.request["return_token_ids"] is True


def test_client_turns_an_unusable_answer_into_a_502_keeping_the_body(stub_upstream):
    body = mutated(_set("choice", "token_ids", ["a"]))
    stub_upstream.plans["unusable"] = Plan(answer=lambda _: (200, json.dumps(body).encode(), {}))
    with pytest.raises(UpstreamError) as error:
        call(UpstreamClient(stub_upstream.url), {"messages": []}, "unusable")
    assert (error.value.kind, error.value.status, error.value.body) == ("invalid", 502, body)
    assert "choices[0].token_ids" in str(error.value) and error.value.request["return_token_ids"] is True


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_client_refuses_an_answer_with_non_standard_numbers(stub_upstream, constant):
    """Not JSON, so never stored as data: the call fails as unusable instead."""
    raw = fixture_body("chat_top2").replace(b'"logprob":', f'"logprob":{constant},"was":'.encode(), 1)
    stub_upstream.plans["nan"] = Plan(answer=lambda _: (200, raw, {}))
    with pytest.raises(UpstreamError) as error:
        call(UpstreamClient(stub_upstream.url), {"messages": []}, "nan")
    assert (error.value.kind, error.value.status) == ("invalid", 502)


def test_client_keeps_retry_after(stub_upstream):
    answer = (429, b'{"error":{"message":"slow down","code":429}}', {"retry-after": "7"})
    stub_upstream.plans["busy"] = Plan(answer=lambda _: answer)
    with pytest.raises(UpstreamError) as error:
        call(UpstreamClient(stub_upstream.url), {"messages": []}, "busy")
    assert (error.value.status, error.value.headers, str(error.value)) == (429, {"retry-after": "7"}, "slow down")


def test_client_unreachable():
    with pytest.raises(UpstreamError) as error:
        call(UpstreamClient(f"http://127.0.0.1:{free_port()}"), {"messages": []})
    assert (error.value.kind, error.value.status) == ("unreachable", 502)


def test_client_timeout(stub_upstream):
    stub_upstream.plans["slow"] = Plan(delay=2.0)
    with pytest.raises(UpstreamError) as error:
        call(UpstreamClient(stub_upstream.url, timeout=0.3), {"messages": []}, "slow")
    assert (error.value.kind, error.value.status) == ("timeout", 504)


def test_models_are_learned_and_unknown_names_map_to_the_served_one(stub_upstream):
    async def run():
        client = UpstreamClient(stub_upstream.url)
        try:
            return await client.resolve_model("tiny"), await client.resolve_model("gpt-4o"), client.models
        finally:
            await client.aclose()

    assert asyncio.run(run()) == ("tiny", "tiny", ["tiny"])


def test_an_upstream_without_a_model_list_is_not_asked_on_every_call():
    """An engine without `/v1/models` costs one round trip, not one per call; names pass through."""
    async def run(client: UpstreamClient):
        try:
            return [await client.resolve_model("gpt-4o") for _ in range(3)]
        finally:
            await client.aclose()

    with StubUpstream(lists_models=False) as stub:
        assert asyncio.run(run(UpstreamClient(stub.url))) == ["gpt-4o"] * 3
    assert stub.model_lists == 1


def test_an_engine_starting_after_the_gateway_is_asked_again():
    """Unreachable at the first call, listed at the next: the served name is learned then."""
    async def run(client: UpstreamClient, stub: StubUpstream):
        try:
            first = await client.resolve_model("gpt-4o")
            with stub:
                return first, await client.resolve_model("gpt-4o")
        finally:
            await client.aclose()

    stub = StubUpstream(port=free_port())
    assert asyncio.run(run(UpstreamClient(f"http://127.0.0.1:{stub.port}"), stub)) == ("gpt-4o", "tiny")
    assert stub.model_lists == 1
