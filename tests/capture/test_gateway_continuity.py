"""Token continuity end to end: the scripted engine samples every turn as non-canonical ids (`"tokens":
"split"`: words in pieces, `<tool_call>` as text), each official SDK runs a multi-turn tool session through
a gateway in each tokenization mode, and the prefix_merging build of the store is read back.

In `gateway` mode every later prompt is the previous prompt + its sampled ids verbatim + the new tokens:
one chain, zero drift, also with thinking off (each API's way of asking for it), where the template ends
every generation prompt with an empty think block it leaves out of past turns. In `upstream` mode the
engine re-renders the history canonically: the drift is reported, as tokenization drift.
"""

from __future__ import annotations

import json

import anthropic
import live
import openai
import pytest
from google import genai
from google.genai import types
from tracetap.builders import build
from tracetap.store import connect

from tracetap.common import decode

COMMAND = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
SYSTEM, QUESTION = "You are terse.", "What is here?"
OUTPUTS = ["a.py\nb.py", "hello"]


def bash(command: str) -> dict:
    return {"function": {"name": "Bash", "arguments": {"command": command}}}


SCRIPT = [
    {"content": "Let me look.", "tool_calls": [bash("ls")], "tokens": "split"},
    {"content": "And the notes.", "tool_calls": [bash("cat notes")], "tokens": "split"},
    {"content": "There are two files; the notes say hello.", "tokens": "split"},
]


@pytest.fixture(scope="module")
def gateways(tmp_path_factory, tracetap_home):
    root = tmp_path_factory.mktemp("continuity")
    (root / "a").mkdir(), (root / "b").mkdir()
    with live.scripted_gateway(root / "a", SCRIPT) as upstream_mode, \
            live.scripted_gateway(root / "b", SCRIPT, "--tokenize", "gateway") as gateway_mode:
        yield {"upstream": upstream_mode, "gateway": gateway_mode}


def openai_chat(gw, session: str, options: dict) -> None:
    sdk = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-{session}", max_retries=0)
    tools = [{"type": "function", "function": {"name": "Bash", "description": "Run.", "parameters": COMMAND}}]
    messages: list = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    for output in [*OUTPUTS, None]:
        message = sdk.chat.completions.create(model="gpt-4o", messages=messages, tools=tools,
                                              **options).choices[0].message
        if output is None:
            return
        messages += [message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": output}]


def openai_responses(gw, session: str, options: dict) -> None:
    sdk = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-{session}", max_retries=0)
    tool = {"type": "function", "name": "Bash", "description": "Run.", "parameters": COMMAND}
    history: list = [{"role": "user", "content": QUESTION}]
    for output in [*OUTPUTS, None]:
        answer = sdk.responses.create(model="gpt-5", instructions=SYSTEM, input=history, tools=[tool], store=False,
                                      **options)
        if output is None:
            return
        history += [item.model_dump(exclude_none=True) for item in answer.output]
        history.append({"type": "function_call_output", "call_id": answer.output[-1].call_id, "output": output})


def anthropic_messages(gw, session: str, options: dict) -> None:
    sdk = anthropic.Anthropic(base_url=gw.url, api_key=f"sk-tap-{session}", max_retries=0)
    tool = {"name": "Bash", "description": "Run.", "input_schema": COMMAND}
    messages: list = [{"role": "user", "content": QUESTION}]
    for output in [*OUTPUTS, None]:
        answer = sdk.messages.create(model="claude-test", max_tokens=256, system=SYSTEM, messages=messages,
                                     tools=[tool], **options)
        if output is None:
            return
        use = next(block for block in answer.content if block.type == "tool_use")
        messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": output}]}]


def gemini(gw, session: str, options: dict) -> None:
    sdk = genai.Client(api_key=f"sk-tap-{session}", http_options=types.HttpOptions(base_url=gw.url))
    declaration = types.FunctionDeclaration(name="Bash", description="Run.", parameters_json_schema=COMMAND)
    config = types.GenerateContentConfig(system_instruction=SYSTEM,
                                         tools=[types.Tool(function_declarations=[declaration])], **options)
    history: list = [types.Content(role="user", parts=[types.Part(text=QUESTION)])]
    for output in [*OUTPUTS, None]:
        answer = sdk.models.generate_content(model="gemini-2.5-flash", contents=history, config=config)
        if output is None:
            return
        (call,) = answer.function_calls
        result = types.Part(function_response=types.FunctionResponse(id=call.id, name=call.name,
                                                                     response={"output": output}))
        history += [answer.candidates[0].content, types.Content(role="user", parts=[result])]


SDKS = {"openai_chat": openai_chat, "openai_responses": openai_responses,
        "anthropic_messages": anthropic_messages, "gemini": gemini}
# each API's way of turning thinking off (Codex at reasoning effort `minimal`): enable_thinking=false
THINKING_OFF = {"openai_chat": {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
                "openai_responses": {"reasoning": {"effort": "minimal"}},
                "anthropic_messages": {"thinking": {"type": "disabled"}},
                "gemini": {"thinking_config": types.ThinkingConfig(thinking_budget=0)}}
EMPTY_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # the generation prompt with thinking off


def trace_metadata(store, session_id: str) -> list[dict]:
    query = ("SELECT metadata_json FROM trajectories WHERE builder = 'prefix_merging' AND session_id = ? "
             "ORDER BY trace_index")
    return [json.loads(text) for (text,) in connect(store).execute(query, [session_id]).fetchall()]


def session_build(gw, session: str) -> tuple[list[dict], dict, list[dict]]:
    """(stored rows, prefix_merging stats, trace metadata) of one session."""
    sid = f"sk-tap-{session}"
    stats = build(gw.store, "prefix_merging", [sid], decode=decode).session_stats[sid]
    return live.store_rows(gw.store, "session_id = ?", [sid]), stats, trace_metadata(gw.store, sid)


def assert_continued_with_zero_drift(api: str, calls: list[dict], stats: dict, traces: list[dict]) -> None:
    """Each call continues the one before verbatim (the sampled pieces kept): one chain, no drift."""
    assert [call["status"] for call in calls] == ["ok"] * 3 and {call["api"] for call in calls} == {api}
    meta = [json.loads(call["metadata_json"]) for call in calls]
    ids = [call["completion_id"] for call in calls]
    assert [m["continues"] for m in meta] == [None, *ids[:2]]
    for earlier, later, m in zip(calls, calls[1:], meta[1:], strict=False):
        head = list(earlier["prompt_token_ids"]) + list(earlier["completion_token_ids"])
        assert list(later["prompt_token_ids"][:len(head)]) == head  # verbatim: the sampled pieces kept
        assert m["added_tokens"] == len(later["prompt_token_ids"]) - len(head) > 0
    assert 151657 not in calls[0]["completion_token_ids"]  # `<tool_call>` was sampled as text pieces
    assert (stats["chains"], stats["segments"], stats["drift_tokens"], stats["break_reasons"]) == (1, 1, 0, {})
    assert [trace["tokenization"] for trace in traces] == ["gateway"]


@pytest.mark.parametrize("api", list(SDKS))
def test_gateway_mode_merges_non_canonical_turns_with_zero_drift(gateways, api):
    SDKS[api](gateways["gateway"], f"{api}-gw", {})
    assert_continued_with_zero_drift(api, *session_build(gateways["gateway"], f"{api}-gw"))


@pytest.mark.parametrize("api", list(SDKS))
def test_gateway_mode_continues_thinking_off_turns_with_zero_drift(gateways, api):
    """The empty think block ending each generation prompt (left out of past turns when the template renders
    them again) stays in the continued prompt as the model saw it."""
    SDKS[api](gateways["gateway"], f"{api}-off", THINKING_OFF[api])
    calls, stats, traces = session_build(gateways["gateway"], f"{api}-off")
    assert all(decode(call["prompt_token_ids"]).endswith(EMPTY_THINK) for call in calls)  # thinking was off
    assert_continued_with_zero_drift(api, calls, stats, traces)


@pytest.mark.parametrize("api", list(SDKS))
def test_upstream_mode_reports_the_drift_of_the_same_sessions(gateways, api):
    gw = gateways["upstream"]
    SDKS[api](gw, f"{api}-up", {})
    calls, stats, traces = session_build(gw, f"{api}-up")
    assert [call["status"] for call in calls] == ["ok"] * 3
    assert stats["chains"] == 1 and stats["drift_tokens"] > 0
    assert stats["drift_tokens_by_kind"].get("tokenization", 0) > 0
    assert [trace["tokenization"] for trace in traces] == ["upstream"]
