"""prefix_merging on sessions captured for real, shaped like what real harnesses do (issue 8 §6): a
`tracetap gateway` process over the scripted embedded engine, driven by the official SDKs.

- parallel attempts: two calls with one prompt sample A and B (B holds all of A's tokens and more), the
  history continues A;
- thinking disabled: an Anthropic agent with `thinking: {type: disabled}` (the template then adds an
  empty think block after each generation prompt only);
- identical sub-agent threads: two threads sending the same prompts and getting the same answers.
"""

from __future__ import annotations

import json

import anthropic
import live
import openai
import pytest
from tracestore import read_completions, read_traces
from tracetap.builders import build
from tracetap.engine.tokenizer import load_tokenizer
from tracetap.store import connect

from tracetap.common import decode

LS = {"function": {"name": "Bash", "arguments": {"command": "ls"}}}
CAT = {"function": {"name": "Bash", "arguments": {"command": "cat a.py"}}}
WITH_TOOLS, WITHOUT_TOOLS = {"has_tools": True}, {"has_tools": False}
SCRIPT = [  # each session takes the first unused line its request matches
    {"content": "Looking.", "tool_calls": [LS], "when": WITH_TOOLS},
    {"content": "Looking.", "tool_calls": [LS, CAT], "when": WITH_TOOLS},
    {"content": "Done.", "when": WITH_TOOLS},
    {"content": "Same answer.", "when": WITHOUT_TOOLS},
    {"content": "Same answer.", "when": WITHOUT_TOOLS},
    {"content": "Second.", "when": WITHOUT_TOOLS},
    {"content": "Second.", "when": WITHOUT_TOOLS},
]
BASH = {"type": "function", "function": {"name": "Bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
QUESTION = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is here?"}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, tracetap_home):
    with live.scripted_gateway(tmp_path_factory.mktemp("fidelity"), SCRIPT) as process:
        yield process


def chat(gateway, session: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=session, max_retries=0)


def merged(gateway, session: str) -> tuple[list[dict], list[dict], dict]:
    """(traces, completions, stats) of the session after a prefix_merging build with the real decode."""
    summary = build(gateway.store, "prefix_merging", [session], decode=decode)
    return (read_traces(gateway.store, "prefix_merging", session), read_completions(gateway.store, session),
            summary.session_stats[session])


def test_parallel_attempts_pair_the_continuation_with_the_one_it_repeats(gateway):
    sdk, session = chat(gateway, "sk-tap-parallel"), "sk-tap-parallel"
    a, b = (sdk.chat.completions.create(model="m", messages=QUESTION, tools=[BASH]) for _ in range(2))
    assert len(a.choices[0].message.tool_calls) == 1 and len(b.choices[0].message.tool_calls) == 2
    message = a.choices[0].message
    history = [*QUESTION, message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "a.py"}]
    sdk.chat.completions.create(model="m", messages=history, tools=[BASH])
    traces, calls, stats = merged(gateway, session)
    ids = [call["completion_id"] for call in calls]
    assert [t["completion_ids"] for t in traces] == [[ids[0], ids[2]], [ids[1]]]
    assert (stats["chains"], stats["retries"], stats["drift_tokens"], stats["break_reasons"]) == (2, 0, 0, {})
    assert {t["status"] for t in traces} == {"ok"}
    stream = traces[0]["prompt_token_ids"] + traces[0]["response_token_ids"]
    assert stream[:len(calls[2]["prompt_token_ids"])] == calls[2]["prompt_token_ids"]


def assistant(message: anthropic.types.Message) -> dict:
    return {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in message.content]}


def results(message: anthropic.types.Message) -> dict:
    uses = [block for block in message.content if block.type == "tool_use"]
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "a.py"} for u in uses]}


def test_a_thinking_disabled_agent_merges_into_one_segment(gateway):
    sdk = anthropic.Anthropic(base_url=gateway.url, api_key="sk-tap-nothink", max_retries=0)
    tool = {"name": "Bash", "description": "Run a shell command.", "input_schema": BASH["function"]["parameters"]}
    history = [{"role": "user", "content": "What is here?"}]
    for _ in range(3):
        message = sdk.messages.create(model="claude-test", max_tokens=64, system="You are terse.",
                                      messages=history, tools=[tool], thinking={"type": "disabled"})
        history += [assistant(message), results(message)]
    assert message.content[0].text == "Done."
    traces, calls, stats = merged(gateway, "sk-tap-nothink")
    sent = [json.loads(call["chat_request_json"]) for call in calls]
    assert {json.dumps(s.get("chat_template_kwargs")) for s in sent} == {'{"enable_thinking": false}'}
    first = calls[0]["prompt_token_ids"]
    assert calls[1]["prompt_token_ids"][:len(first)] != first  # the block is only after the generation prompt
    (trace,) = traces
    assert trace["completion_ids"] == [call["completion_id"] for call in calls]
    assert (stats["segments"], stats["break_reasons"], trace["status"]) == (1, {}, "ok")
    block = load_tokenizer().encode("<think>\n\n</think>\n\n")  # what the template adds, in real ids
    assert stats["drift_tokens_by_kind"] == {"template": 2 * len(block)}
    assert first[len(first) - len(block):] == block  # right before the first turn's sampled ids
    spans = trace["metadata"]["trace"]["drift"]
    assert [(s["completion_id"], s["sampled"]) for s in spans] == [
        (call["completion_id"], [-len(block), 0]) for call in calls[:2]]
    response = trace["response_token_ids"]
    for span, call in zip(trace["metadata"]["spans"], calls, strict=True):
        assert response[span["start"]:span["start"] + span["length"]] == call["completion_token_ids"]


def test_identical_sub_agent_threads_stay_two_chains(gateway):
    sdk, session = chat(gateway, "sk-tap-threads"), "sk-tap-threads"
    first = [sdk.chat.completions.create(model="m", messages=QUESTION) for _ in range(2)]
    assert {r.choices[0].message.content for r in first} == {"Same answer."}
    follow = [*QUESTION, {"role": "assistant", "content": "Same answer."}, {"role": "user", "content": "Go on."}]
    second = [sdk.chat.completions.create(model="m", messages=follow) for _ in range(2)]
    assert {r.choices[0].message.content for r in second} == {"Second."}
    traces, calls, stats = merged(gateway, session)
    assert (stats["chains"], stats["segments"], stats["retries"], stats["completions_preserved"]) == (2, 2, 0, 4)
    assert sorted(c for t in traces for c in t["completion_ids"]) == sorted(c["completion_id"] for c in calls)
    assert [len(t["completion_ids"]) for t in traces] == [2, 2]
    with connect(gateway.store) as con:
        chains = con.execute("SELECT chain_index FROM completions WHERE session_id = ? ORDER BY seq",
                             [session]).fetchall()
    assert sorted(chains) == [(0,), (0,), (1,), (1,)]
