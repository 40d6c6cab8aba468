"""Replay mode end to end. Multi-turn tool-using sessions are recorded through a real gateway (scripted engine)
with each official SDK, then replayed by the same SDK against gateways whose upstream is a closed port, so no
model can answer: the raw bodies must come back byte for byte. A chat-recorded session is replayed through the
anthropic SDK; changed requests miss with an API-shaped 404, or reach a live engine with --replay-miss forward.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx2
import live
import openai
import pytest
from click.testing import CliRunner
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from store_forms import as_form
from tracetap.capture.record import Call, build_row
from tracetap.capture.replay import RecordedStore, ReplayMiss, ReplayUpstream, chat_body
from tracetap.capture.upstream import (
    UpstreamClient,
    UpstreamError,
    parse_chat_response,
    strip_token_arrays,
    with_token_flags,
)
from tracetap.store import StoreWriter

from tracetap.cli import cli

COMMAND = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
LS = {"function": {"name": "Bash", "arguments": {"command": "ls"}}}
SCRIPT = [  # every session plays these in order
    {"content": "Let me look.", "tool_calls": [LS]},
    {"content": "There are two files.", "reasoning": "The listing answered it."},
    {"content": "Nothing else."},
]
SYSTEM, QUESTION, RESULT, FOLLOW_UP = "You are terse.", "What is here?", "a.py\nb.py", "Anything else?"
APIS = ("openai_chat", "openai_responses", "anthropic_messages", "gemini")


class Tape(httpx2.BaseTransport):
    """Keeps every raw response body (streams included) before the SDK parses it (the SDKs use httpx2)."""

    def __init__(self) -> None:
        self.inner = httpx2.HTTPTransport()
        self.bodies: list[bytes] = []

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = self.inner.handle_request(request)
        body = response.read()
        self.bodies.append(body)
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() != "content-encoding"]
        return httpx2.Response(response.status_code, headers=headers, content=body, request=request)


def session(api: str) -> str:
    return f"sk-tap-{api.replace('_', '-')}"


def sdk(api: str, url: str, key: str, http: httpx2.Client):
    if api in ("openai_chat", "openai_responses"):
        return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, http_client=http)
    if api == "anthropic_messages":
        return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, http_client=http)
    return genai.Client(api_key=key, http_options=types.HttpOptions(base_url=url, httpx_client=http))


def chat_agent(client: openai.OpenAI, question: str = QUESTION) -> list:
    """Three turns: a tool call, its result answered over a stream (with reasoning), a follow-up."""
    tools = [{"type": "function", "function": {"name": "Bash", "description": "Run a shell command.",
                                               "parameters": COMMAND}}]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    first = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools, max_tokens=64)
    call = first.choices[0].message.tool_calls[0]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    chunks = list(client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools, max_tokens=64,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning", None) or "" for c in chunks if c.choices)
    messages += [{"role": "assistant", "content": text, "reasoning": reasoning},
                 {"role": "user", "content": FOLLOW_UP}]
    third = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools, max_tokens=64)
    return [first, chunks, third]


def responses_agent(client: openai.OpenAI, question: str = QUESTION) -> list:
    """The same conversation the way Codex says it: full history every turn, reasoning sent back."""
    tool = {"type": "function", "name": "Bash", "description": "Run a shell command.", "parameters": COMMAND,
            "strict": False}
    common = {"model": "gpt-5-codex", "instructions": SYSTEM, "tools": [tool], "store": False,
              "max_output_tokens": 64, "include": ["reasoning.encrypted_content"]}
    history: list = [{"role": "user", "content": question}]
    first = client.responses.create(input=history, **common)
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": first.output[-1].call_id, "output": RESULT})
    events = list(client.responses.create(input=history, stream=True, **common))
    history += [item.model_dump(exclude_none=True) for item in events[-1].response.output]
    history.append({"role": "user", "content": FOLLOW_UP})
    third = client.responses.create(input=history, **common)
    return [first, events, third]


def anthropic_agent(client: anthropic.Anthropic, question: str = QUESTION) -> list:
    """The same conversation the way Claude Code says it (a billing line that changes every turn)."""
    tools = [{"name": "Bash", "description": "Run a shell command.", "input_schema": COMMAND}]

    def system(turn: int) -> list[dict]:
        return [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.0; cch={turn:05x};"},
                {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]

    def assistant(message) -> dict:
        return {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}

    history: list = [{"role": "user", "content": question}]
    first = client.messages.create(model="claude-test", max_tokens=64, system=system(1), messages=history,
                                   tools=tools)
    history += [assistant(first), {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": first.content[-1].id, "content": RESULT}]}]
    with client.messages.stream(model="claude-test", max_tokens=64, system=system(2), messages=history,
                                tools=tools) as stream:
        events = list(stream)
        second = stream.get_final_message()
    history += [assistant(second), {"role": "user", "content": FOLLOW_UP}]
    third = client.messages.create(model="claude-test", max_tokens=64, system=system(3), messages=history,
                                   tools=tools)
    return [first, events, second, third]


def gemini_agent(client: genai.Client, question: str = QUESTION) -> list:
    bash = types.FunctionDeclaration(name="Bash", description="Run a shell command.", parameters=types.Schema(
        type="OBJECT", properties={"command": types.Schema(type="STRING")}, required=["command"]))
    config = types.GenerateContentConfig(system_instruction=SYSTEM, max_output_tokens=64,
                                         tools=[types.Tool(function_declarations=[bash])],
                                         thinking_config=types.ThinkingConfig(include_thoughts=True))
    model = "gemini-2.5-flash"
    history = [types.Content(role="user", parts=[types.Part(text=question)])]
    first = client.models.generate_content(model=model, contents=history, config=config)
    call = first.function_calls[0]
    answer = types.FunctionResponse(id=call.id, name=call.name, response={"output": RESULT})
    history += [first.candidates[0].content, types.Content(role="user", parts=[types.Part(function_response=answer)])]
    chunks = list(client.models.generate_content_stream(model=model, contents=history, config=config))
    parts = [part for chunk in chunks for part in chunk.candidates[0].content.parts]
    history += [types.Content(role="model", parts=parts),
                types.Content(role="user", parts=[types.Part(text=FOLLOW_UP)])]
    third = client.models.generate_content(model=model, contents=history, config=config)
    return [first, chunks, third]


AGENTS: dict[str, Callable] = {"openai_chat": chat_agent, "openai_responses": responses_agent,
                               "anthropic_messages": anthropic_agent, "gemini": gemini_agent}


@dataclass
class Run:
    results: list  # the SDK objects, dumped
    bodies: list[bytes]  # the raw response bodies


def run(api: str, url: str, key: str, **kwargs) -> Run:
    """One agent session of `api` through the gateway at `url`; raises what the SDK raises."""
    tape = Tape()
    with httpx2.Client(transport=tape, timeout=60) as http:
        results = AGENTS[api](sdk(api, url, key, http), **kwargs)
    return Run(dump(results), tape.bodies)


def dump(value: object) -> object:
    """SDK objects as plain data; google-genai keeps the HTTP headers, which name each new record."""
    if isinstance(value, list):
        return [dump(v) for v in value]
    return value.model_dump(mode="json", exclude={"sdk_http_response"})


def rows(store: Path, where: str = "true", params: list | None = None) -> list[dict]:
    """`live.store_rows` plus `meta`, the parsed metadata_json."""
    return [{**row, "meta": json.loads(row["metadata_json"])} for row in live.store_rows(store, where, params)]


@dataclass
class RecordedRuns:
    root: Path
    store: Path
    engine: live.EngineProcess
    runs: dict[str, Run]


@pytest.fixture(scope="module")
def recording(tmp_path_factory, tracetap_home):
    """One session per API recorded through a real gateway, which is stopped before any replay."""
    root = tmp_path_factory.mktemp("replay")
    with live.start_engine(root / "engine", live.write_script(root / "script.jsonl", SCRIPT)) as engine:
        with live.start_gateway(root / "recorded", "--upstream", engine.url) as gateway:
            runs = {api: run(api, gateway.url, session(api)) for api in APIS}
        yield RecordedRuns(root, gateway.store, engine, runs)


def closed_port() -> str:
    return f"http://127.0.0.1:{live.free_port()}"


@pytest.fixture(scope="module")
def replayer(recording):
    """A gateway that can only replay: its upstream is a port nobody listens on."""
    args = ("--replay", str(recording.store), "--upstream", closed_port())
    with live.start_gateway(recording.root / "replayed", *args) as gateway:
        yield gateway


@pytest.mark.parametrize("api", APIS)
def test_replay_gives_the_same_bytes_with_no_model(recording, replayer, api):
    recorded = recording.runs[api]
    replay = run(api, replayer.url, session(api))
    assert replay.results == recorded.results
    assert replay.bodies == recorded.bodies and len(replay.bodies) == 3

    source = rows(recording.store, "session_id = ?", [session(api)])
    replayed = rows(replayer.store, "session_id = ?", [session(api)])
    assert [r["status"] for r in replayed] == ["ok"] * 3  # zero misses
    assert [r["meta"]["capture_mode"] for r in replayed] == ["replay"] * 3
    assert [r["meta"]["replay_of"] for r in replayed] == [
        {"session_id": r["session_id"], "completion_id": r["completion_id"]} for r in source]
    assert {r["completion_id"] for r in replayed}.isdisjoint(r["completion_id"] for r in source)
    columns = ("api", "stream", "finish_reason", "prompt_token_ids", "completion_token_ids", "logprobs",
               "tool_calls", "served_model", "response_json")
    assert [[r[c] for c in columns] for r in replayed] == [[r[c] for c in columns] for r in source]
    assert [r["finish_reason"] for r in source] == ["tool_calls", "stop", "stop"]


def test_a_chat_session_replays_through_the_anthropic_sdk(recording, replayer):
    """--replay-session maps every caller to the recorded chat session; the answers render as Messages."""
    args = ("--replay", str(recording.store), "--replay-session", session("openai_chat"), "--upstream",
            closed_port())
    with live.start_gateway(recording.root / "cross", *args) as gateway:
        replay = run("anthropic_messages", gateway.url, "sk-tap-cross")
    native = recording.runs["anthropic_messages"].results  # the same conversation recorded through anthropic
    first, second, third = (replay.results[i] for i in (0, 2, 3))
    assert [b["type"] for b in first["content"]] == ["text", "tool_use"] and first["stop_reason"] == "tool_use"
    assert first["content"][1]["input"] == {"command": "ls"}
    assert second["content"][0]["thinking"] == "The listing answered it."
    assert second["content"][1]["text"] == "There are two files." and third["content"][0]["text"] == "Nothing else."
    for got, want in zip((first, second, third), (native[0], native[2], native[3]), strict=True):
        assert without_ids(got) == without_ids(want)
    assert [e["type"] for e in replay.results[1]] == [e["type"] for e in native[1]]

    replayed = rows(gateway.store)
    source = rows(recording.store, "session_id = ?", [session("openai_chat")])
    assert {(r["session_id"], r["api"], r["status"]) for r in replayed} == {
        ("sk-tap-cross", "anthropic_messages", "ok")}
    assert [r["meta"]["replay_of"]["completion_id"] for r in replayed] == [r["completion_id"] for r in source]
    assert [r["completion_token_ids"] for r in replayed] == [r["completion_token_ids"] for r in source]


def without_ids(message: dict) -> dict:
    content = [{k: v for k, v in block.items() if k != "id"} for block in message["content"]]
    return {**{k: v for k, v in message.items() if k != "id"}, "content": content}


MISSES = {  # api -> (the SDK error the harness sees, its API-shaped body)
    "openai_chat": (openai.NotFoundError, lambda body: body["error"]["code"] == "not_found"),
    "openai_responses": (openai.NotFoundError, lambda body: body["error"]["code"] == "not_found"),
    "anthropic_messages": (anthropic.NotFoundError, lambda body: body["error"]["type"] == "not_found_error"),
    "gemini": (genai_errors.ClientError, lambda body: body["error"]["status"] == "NOT_FOUND"),
}


@pytest.mark.parametrize("api", APIS)
def test_a_changed_request_misses_with_an_api_shaped_404(recording, replayer, api):
    error_class, shaped = MISSES[api]
    with pytest.raises(error_class) as caught:
        run(api, replayer.url, session(api), question="What is there?")
    assert "replay miss" in str(caught.value) and '"What is here?"' in str(caught.value)
    assert getattr(caught.value, "status_code", getattr(caught.value, "code", None)) == 404
    assert shaped(caught.value.response.json())

    [miss] = rows(replayer.store, "session_id = ? AND status <> 'ok'", [session(api)])
    first = rows(recording.store, "session_id = ? AND seq = 0", [session(api)])[0]
    assert (miss["status"], miss["http_status"], miss["meta"]["capture_mode"]) == ("client_error", 404, "replay")
    assert miss["meta"]["replay_miss"]["closest"] == {"seq": 0, "completion_id": first["completion_id"]}
    assert miss["prompt_token_ids"] is None and json.loads(miss["chat_request_json"])["messages"]
    log = replayer.log()
    assert f"replay miss in session {session(api)}" in log and "this request \"What is there?\"" in log


def test_a_missing_session_and_a_used_up_answer_miss_too(recording, replayer):
    chat = openai.OpenAI(base_url=f"{replayer.url}/v1", api_key="sk-tap-never-recorded", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="has no recorded completions"):
        chat_agent(chat)
    again = openai.OpenAI(base_url=f"{replayer.url}/v1", api_key=session("openai_chat"), max_retries=0)
    with pytest.raises(openai.NotFoundError, match="every recorded answer was already replayed"):
        chat_agent(again)  # the byte-identical replay above used the only recorded copy


def test_forward_sends_misses_to_the_live_upstream(recording):
    args = ("--replay", str(recording.store), "--replay-miss", "forward", "--upstream", recording.engine.url)
    with live.start_gateway(recording.root / "forward", *args) as gateway:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="sk-tap-forward", max_retries=0)
        live_answer = client.chat.completions.create(
            model="gpt-4o", max_tokens=64, messages=[{"role": "user", "content": "Something new"}])
        replay = run("openai_chat", gateway.url, session("openai_chat"))
    assert live_answer.choices[0].message.content.startswith("Let me look.")  # the engine's script, from its start
    assert replay.bodies == recording.runs["openai_chat"].bodies
    forwarded, *replayed = rows(gateway.store)  # ordered by session: sk-tap-forward, then sk-tap-openai-chat
    assert forwarded["session_id"] == "sk-tap-forward" and forwarded["status"] == "ok"
    assert forwarded["meta"]["capture_mode"] == "live" and "replay_miss" in forwarded["meta"]
    assert len(forwarded["completion_token_ids"]) == len(forwarded["logprobs"]) > 0
    assert [r["meta"]["capture_mode"] for r in replayed] == ["replay"] * 3


@pytest.mark.parametrize(("args", "message"), [
    (["--replay", "{store}"], "another store"),
    (["--replay-session", "s1"], "need --replay"),
    (["--replay", "{source}", "--replay-session", "bad id!"], "invalid session id"),
    (["--replay", "{source}", "--replay-ignore", "tools..name"], "invalid ignore path"),
    (["--replay", "{empty}"], "not a tracetap store"),
], ids=["same-store", "session-alone", "bad-session", "bad-ignore", "not-a-store"])
def test_bad_replay_options_stop_before_anything_starts(tmp_path, recording, args, message):
    (tmp_path / "empty").mkdir()
    paths = {"store": tmp_path / "store", "source": recording.store, "empty": tmp_path / "empty"}
    (tmp_path / "store").mkdir()
    args = [arg.format(**paths) for arg in args]
    result = CliRunner().invoke(cli, ["gateway", "--store", str(tmp_path / "store"), *args])
    assert result.exit_code == 2 and message in result.output
    assert list((tmp_path / "store").iterdir()) == []


# In-process: ReplayUpstream over a store written by the real StoreWriter from the real vLLM fixtures.

REQUEST = {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
FAILING = {**REQUEST, "messages": [{"role": "user", "content": "too long"}]}
MISSED = {**REQUEST, "messages": [{"role": "user", "content": "missed before"}]}


def recorded_call(sid: str, fixture: str, request: dict, status: str = "ok") -> dict:
    """The row the gateway writes for `request` answered by a fixture (an ok answer or an upstream error)."""
    answer = json.loads(live.fixture_body(fixture))
    call = Call(session_id=sid, api="openai_chat", path="/v1/chat/completions", stream=False, requested_model="m",
                request_body=request, completion_id="cmpl-" + fixture.replace("_", ""),
                served_model="tiny", chat_request=with_token_flags(request))
    if status == "ok":
        call.capture, call.response_body = parse_chat_response(answer), {"id": call.completion_id}
    else:
        call.status, call.http_status, call.error, call.upstream_body = status, 400, "too long", answer
    return build_row(call)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> RecordedStore:
    """Session `s`: the same request answered twice (two different answers), a call that failed upstream,
    and the miss of an earlier replay."""
    root = tmp_path_factory.mktemp("source")
    with StoreWriter(root) as writer:
        for row in (recorded_call("s", "chat_basic", REQUEST), recorded_call("s", "chat_top2", REQUEST),
                    recorded_call("s", "error_context_overflow", FAILING, "upstream_error"),
                    recorded_call("s", "error_unknown_model", MISSED, "client_error")):
            writer.record_completion(row)
    return RecordedStore(as_form(root))


def replay_calls(source: RecordedStore, calls: list[tuple[dict, str]], **options) -> list:
    """Each (chat request, caller session) through one ReplayUpstream: its result, or the error raised."""
    async def go() -> list:
        upstream = ReplayUpstream(source, UpstreamClient(closed_port()), **options)
        out = []
        for request, caller in calls:
            try:
                out.append(await upstream.chat(request, caller))
            except UpstreamError as exc:
                out.append(exc)
        await upstream.aclose()
        return out

    return asyncio.run(go())


@pytest.mark.parametrize("fixture", ["chat_basic", "chat_top2", "chat_tools_auto_call", "chat_stop"])
def test_a_recorded_answer_is_rebuilt_whole(tmp_path, fixture):
    upstream = json.loads(live.fixture_body(fixture))
    with StoreWriter(tmp_path) as writer:
        writer.record_completion(recorded_call("s", fixture, REQUEST))
    [row] = RecordedStore(tmp_path).session_table("s").to_pylist()
    body = chat_body(row)
    assert strip_token_arrays(body) == strip_token_arrays(upstream)
    assert list(body["choices"][0])[:3] == ["index", "message", "logprobs"]  # where vLLM puts them
    again = parse_chat_response(body)
    assert again.prompt_token_ids == row["prompt_token_ids"] == upstream["prompt_token_ids"]
    assert again.completion_token_ids == row["completion_token_ids"] == upstream["choices"][0]["token_ids"]
    assert again.logprobs == row["logprobs"] and again.top_logprobs == row["top_logprobs"]
    assert (again.tool_calls, again.finish_reason) == (row["tool_calls"], row["finish_reason"])


def test_logprobs_a_chat_harness_was_shown_come_back_as_shown(tmp_path):
    upstream = json.loads(live.fixture_body("chat_top2"))
    row = recorded_call("s", "chat_top2", REQUEST)
    row["response_json"] = json.dumps({"choices": [{"logprobs": upstream["choices"][0]["logprobs"]}]})
    with StoreWriter(tmp_path) as writer:
        writer.record_completion(row)
    [stored] = RecordedStore(tmp_path).session_table("s").to_pylist()
    assert chat_body(stored)["choices"][0]["logprobs"] == upstream["choices"][0]["logprobs"]


def test_identical_calls_replay_in_recorded_order_per_caller(source):
    first, second, used_up, other = replay_calls(source, [(REQUEST, "s"), (REQUEST, "s"), (REQUEST, "s"),
                                                          (REQUEST, "t")], session="s")
    assert [r.metadata["replay_of"]["completion_id"] for r in (first, second)] == [
        "cmpl-chatbasic", "cmpl-chattop2"]
    assert first.reply_as[0] == "cmpl-chatbasic" and first.capture.completion_token_ids
    assert isinstance(used_up, ReplayMiss) and "already replayed" in str(used_up) and used_up.status == 404
    assert other.metadata["replay_of"]["completion_id"] == "cmpl-chatbasic"  # caller t starts from the top


def test_a_recorded_failure_replays_as_that_failure(source):
    [failure] = replay_calls(source, [(FAILING, "s")])
    assert not isinstance(failure, ReplayMiss)
    assert (failure.kind, failure.status, str(failure)) == ("http", 400, "too long")
    assert failure.metadata["replay_of"] == {"session_id": "s", "completion_id": "cmpl-errorcontextoverflow"}


def test_the_misses_of_an_earlier_replay_are_not_answers(source):
    [missed] = replay_calls(source, [(MISSED, "s")])
    assert isinstance(missed, ReplayMiss) and "no recorded completion in session 's'" in str(missed)


def test_ignored_fields_match_and_the_rest_explains_the_miss(source):
    warmer = {**REQUEST, "temperature": 0.7}
    hit, miss = replay_calls(source, [(warmer, "s"), ({**warmer, "max_tokens": 17}, "s")], ignore=["temperature"])
    assert hit.metadata["capture_mode"] == "replay"
    assert miss.metadata["replay_miss"]["differences"] == ["max_tokens: recorded 16, this request 17"]
    assert miss.metadata["replay_miss"]["closest"]["seq"] == 0 and miss.request["max_tokens"] == 17


def test_replay_counts_are_kept_for_the_most_recent_callers_only(source):
    others = [(REQUEST, f"caller-{n}") for n in range(4)]
    results = replay_calls(source, [(REQUEST, "s"), (REQUEST, "s"), *others, (REQUEST, "s")], session="s",
                           counted_callers=4)
    replayed = [r.metadata["replay_of"]["completion_id"] for r in (results[0], results[1], results[-1])]
    assert replayed == ["cmpl-chatbasic", "cmpl-chattop2", "cmpl-chatbasic"]  # its count was dropped
