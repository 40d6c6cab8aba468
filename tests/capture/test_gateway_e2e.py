"""The gateway end to end: a real `tracetap gateway` process with the embedded engine in scripted mode,
driven by the official `openai` SDK; every check reads the store the gateway wrote.
"""

from __future__ import annotations

import json
import threading

import httpx
import live
import openai
import pytest
from tracetap.engine.tokenizer import load_tokenizer
from tracetap.store import connect

COMMAND = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS = [{"type": "function",
          "function": {"name": "Bash", "description": "Run a shell command.", "parameters": COMMAND}}]
LS = {"function": {"name": "Bash", "arguments": {"command": "ls"}}}
SCRIPT = [  # per session: three agent runs of two turns each
    {"content": "Let me look.", "tool_calls": [LS]},
    {"content": "There are two files.", "reasoning": "The listing answered it."},
] * 3
FIRST_TURN = [{"role": "developer", "content": "You are terse."},
              {"role": "user", "content": "What is here?"}]
ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def gw(tmp_path_factory, tracetap_home):
    with live.scripted_gateway(tmp_path_factory.mktemp("e2e"), SCRIPT) as process:
        yield process


def client(gw, key: str = "x", base: str | None = None, **headers) -> openai.OpenAI:
    return openai.OpenAI(base_url=base or f"{gw.url}/v1", api_key=key, max_retries=0,
                         default_headers=headers or None)


def rows(gw, where: str = "true") -> list[dict]:
    return live.store_rows(gw.store, where)


def run_agent(chat: openai.OpenAI, stream_second: bool) -> list[str]:
    """Two turns of a tool-using agent: the scripted tool call, its result, the scripted answer."""
    messages = list(FIRST_TURN)
    first = chat.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS, max_tokens=64)
    call = first.choices[0].message.tool_calls[0]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "a.py\nb.py"}]
    if stream_second:
        with chat.chat.completions.stream(model="gpt-4o", messages=messages, tools=TOOLS,
                                          stream_options={"include_usage": True}) as stream:
            second = stream.get_final_completion()
    else:
        second = chat.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS)
    assert (first.model, second.model) == ("gpt-4o", "gpt-4o")
    assert call.function.name == "Bash" and json.loads(call.function.arguments) == {"command": "ls"}
    assert second.choices[0].message.content == "There are two files."
    return [first.id, second.id]


def test_models_list(gw):
    assert [m.id for m in client(gw).models.list()] == ["tracetap-tiny"]
    assert client(gw).models.retrieve("gpt-4o").id == "gpt-4o"


def test_tool_round_trip(gw):
    ids = run_agent(client(gw, **{"x-tracetap-session": "round-trip"}), stream_second=True)
    first, second = rows(gw, "session_id = 'round-trip'")
    assert [first["completion_id"], second["completion_id"]] == ids
    assert [first["seq"], second["seq"]] == [0, 1] and [first["stream"], second["stream"]] == [False, True]
    assert first["finish_reason"] == "tool_calls" and first["tool_calls"][0]["name"] == "Bash"
    assert second["prompt_token_ids"][: len(first["prompt_token_ids"])] == first["prompt_token_ids"]
    assert json.loads(first["chat_request_json"])["messages"][0]["role"] == "system"
    assert json.loads(second["response_json"])["choices"][0]["message"]["content"] == "There are two files."
    assert {r["requested_model"] for r in (first, second)} == {"gpt-4o"}
    assert {r["served_model"] for r in (first, second)} == {"tracetap-tiny"}


def test_task_and_policy_version_labels_are_recorded(gw):
    chat = client(gw, key="sk-tap-labelled", **{"x-tracetap-task": "fix-calc", "x-tracetap-policy-version": "3"})
    chat.chat.completions.create(model="m", messages=FIRST_TURN, max_tokens=8)
    (row,) = rows(gw, "session_id = 'sk-tap-labelled'")
    assert (row["task_id"], row["policy_version"]) == ("fix-calc", "3")
    live.settled_snapshot(gw.store)  # the session row is saved just after the call
    session = connect(gw.store).execute("SELECT task_id FROM sessions WHERE session_id = 'sk-tap-labelled'")
    assert session.fetchone() == ("fix-calc",)


def test_rollout_key_wins_over_the_harness_session_header(gw):
    """What opencode sends with `OPENAI_API_KEY=sk-tap-...`: its own `x-session-id` names a thread only."""
    chat = client(gw, key="sk-tap-opencode-run", **{"x-session-id": "ses_child1",
                                                    "x-parent-session-id": "ses_root1"})
    chat.chat.completions.create(model="m", messages=FIRST_TURN, max_tokens=8)
    (row,) = rows(gw, "session_id = 'sk-tap-opencode-run'")
    meta = json.loads(row["metadata_json"])
    assert (meta["session_source"], meta["harness_session_id"], meta["harness_parent_session_id"]) == (
        "api_key", "ses_child1", "ses_root1")
    assert rows(gw, "session_id LIKE 'ses_%'") == []


def test_raw_stream_chunks(gw):
    chat = client(gw, key="sk-tap-raw-stream")
    chunks = list(chat.chat.completions.create(model="m", messages=FIRST_TURN, tools=TOOLS, stream=True,
                                               stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "tool_calls"
    heads = [t for c in chunks[:-1] for t in c.choices[0].delta.tool_calls or [] if t.id]
    assert [(t.index, t.function.name, t.function.arguments) for t in heads] == [(0, "Bash", "")]
    [row] = rows(gw, "session_id = 'sk-tap-raw-stream'")
    assert row["completion_id"] == chunks[0].id
    assert row["completion_tokens"] == chunks[-1].usage.completion_tokens


def test_logprobs_the_client_asks_for(gw):
    chat = client(gw, key="sk-tap-logprobs")
    plain = chat.chat.completions.create(model="m", messages=FIRST_TURN, logprobs=True, top_logprobs=2)
    with chat.chat.completions.stream(model="m", messages=FIRST_TURN, logprobs=True) as stream:
        streamed = stream.get_final_completion()
    first, second = rows(gw, "session_id = 'sk-tap-logprobs'")
    assert [e.logprob for e in plain.choices[0].logprobs.content] == pytest.approx(first["logprobs"])
    assert [len(t) for t in first["top_logprobs"]] == [2] * first["completion_tokens"]
    assert [e.logprob for e in streamed.choices[0].logprobs.content] == pytest.approx(second["logprobs"])
    assert second["top_logprobs"] is None


def test_two_concurrent_sessions_never_mix(gw):
    results: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def agent(name: str, chat: openai.OpenAI) -> None:
        try:
            results[name] = run_agent(chat, name == "sk-tap-b") + run_agent(chat, stream_second=False)
        except BaseException as exc:  # surfaced below: a thread's failure must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=("conc-a", client(gw, base=f"{gw.url}/s/conc-a/v1"))),
               threading.Thread(target=agent, args=("sk-tap-b", client(gw, key="sk-tap-b")))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    for name in ("conc-a", "sk-tap-b"):
        stored = [r for r in rows(gw) if r["completion_id"] in results[name]]
        assert len([r for r in rows(gw) if r["session_id"] == name]) == 4
        assert {r["session_id"] for r in stored} == {name} and [r["seq"] for r in stored] == [0, 1, 2, 3]
    # each session plays the script from its own start
    assert [r["finish_reason"] for r in rows(gw, "session_id = 'conc-a'")] == ["tool_calls", "stop"] * 2


GOOD = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def earlier_data(gw):
    """Something already stored that bad input must leave untouched."""
    run_agent(client(gw, key="sk-tap-before-bad-input"), stream_second=False)


@pytest.mark.parametrize(("method", "path", "body", "headers", "status"), [
    ("POST", CHAT, b'{"model": "m", "messages": [', {}, 400),
    ("POST", CHAT, json.dumps([GOOD]).encode(), {}, 400),
    ("POST", CHAT, json.dumps({"model": "m", "messages": "hi"}).encode(), {}, 400),
    ("POST", CHAT, json.dumps({"messages": [{"role": "user", "content": 3}]}).encode(), {}, 400),
    ("POST", CHAT, json.dumps({**GOOD, "max_tokens": "lots"}).encode(), {}, 400),
    ("POST", CHAT, json.dumps(GOOD).encode(), {"x-tracetap-session": "bad id!"}, 400),
    ("POST", "/s/..%2Fescape" + CHAT, json.dumps(GOOD).encode(), {}, 400),
    ("POST", CHAT + "?session_id=a/b", json.dumps(GOOD).encode(), {}, 400),
    ("POST", "/v1/completions", json.dumps({"prompt": "hi"}).encode(), {}, 404),
    ("GET", CHAT, b"", {}, 404),
    ("POST", CHAT, None, {}, 413),
], ids=["invalid-json", "not-an-object", "messages-type", "content-type", "max-tokens-type",
        "session-header", "session-path", "session-query", "unknown-path", "wrong-method", "oversized"])
def test_bad_input_writes_nothing(gw, earlier_data, method, path, body, headers, status):
    if body is None:
        body = b'{"pad": "' + b"x" * (33 * 2**20) + b'"}'
    before = live.settled_snapshot(gw.store)
    response = httpx.request(method, gw.url + path, content=body, headers=headers, timeout=60)
    assert response.status_code == status
    assert set(response.json()["error"]) == ERROR_KEYS
    assert live.settled_snapshot(gw.store) == before


def test_bad_input_is_the_sdk_error_class(gw):
    with pytest.raises(openai.BadRequestError, match="messages"):
        client(gw).chat.completions.create(model="m", messages=[{"role": "user", "content": 3}])
    with pytest.raises(openai.BadRequestError, match="session id"):
        client(gw, **{"x-session-id": "no spaces please"}).models.list()


def test_close_session_compacts(gw):
    run_agent(client(gw, key="sk-tap-to-close"), stream_second=False)
    response = httpx.post(f"{gw.url}/sessions/sk-tap-to-close/close", headers=live.control_headers())
    assert response.status_code == 200 and response.json()["status"] == "closed"
    assert live.committed_seqs(gw.store, "sk-tap-to-close") == [0, 1]  # in the table, once each
    for segment, keys in live.log_keys(gw.store).items():  # its log lines stay only in a segment the gateway's
        if any(sid == "sk-tap-to-close" for sid, _ in keys):  # other, still open sessions need
            assert any(seq not in live.committed_seqs(gw.store, sid) for sid, seq in keys), segment
    assert len(rows(gw, "session_id = 'sk-tap-to-close'")) == 2
    assert httpx.post(f"{gw.url}/sessions/bad!/close", headers=live.control_headers()).status_code == 400


def test_every_recorded_completion_is_aligned_and_decodes(gw):
    tokenizer = load_tokenizer()
    recorded = rows(gw)
    assert len(recorded) >= 10 and {r["status"] for r in recorded} == {"ok"}
    for row in recorded:
        assert len(row["logprobs"]) == len(row["completion_token_ids"]) == row["completion_tokens"] > 0
        sent = json.loads(row["chat_request_json"])
        assert all(m["role"] != "developer" for m in sent["messages"])
        rendered = tokenizer.render(sent["messages"], sent.get("tools"), add_generation_prompt=True)
        assert tokenizer.decode(row["prompt_token_ids"]) == rendered
