"""`tracetap gateway --tokenize gateway` in front of a real vLLM: multi-turn sessions merge with zero drift.

The gateway renders with the served model's tokenizer folder and calls vLLM's `/v1/completions` with ids;
each later prompt continues the previous call's prompt + sampled ids verbatim (capture/continuity.py), so
the forced tool session (whose turns upstream mode sees re-tokenized, test_upstream_mode.py) merges into one
chain without drift here, and so do multi-turn sessions of each API whose turns are cut at `length`.
"""

from __future__ import annotations

import json

import anthropic
import live
import openai
import pytest
import vllm_server
from google import genai
from google.genai import types
from tracetap.builders import build
from tracetap.engine.tokenizer import IM_END_ID
from vllm_calls import MAX_TOKENS, QUESTION, SYSTEM, rows, run_tool_session, trace_metadata

FOLLOW_UPS = ("Go on.", "And then?")


@pytest.fixture(scope="module")
def gw(vllm, tmp_path_factory):
    store = tmp_path_factory.mktemp("vllm-gateway") / "store"
    with live.start_gateway(store, "--upstream", vllm.url, "--tokenize", "gateway",
                            "--tokenizer", str(vllm_server.model_dir())) as process:
        yield process


def openai_chat(gw, session: str) -> None:
    sdk = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-{session}", max_retries=0)
    messages: list = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    for follow_up in FOLLOW_UPS:
        text = sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=MAX_TOKENS,
                                           temperature=0).choices[0].message.content
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": follow_up}]
    sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=MAX_TOKENS, temperature=0)


def openai_responses(gw, session: str) -> None:
    sdk = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-{session}", max_retries=0)
    history: list = [{"role": "user", "content": QUESTION}]
    common = {"model": "tiny", "instructions": SYSTEM, "max_output_tokens": MAX_TOKENS, "temperature": 0,
              "store": False}
    for follow_up in FOLLOW_UPS:
        answer = sdk.responses.create(input=history, **common)
        history += [item.model_dump(exclude_none=True) for item in answer.output]
        history.append({"role": "user", "content": follow_up})
    sdk.responses.create(input=history, **common)


def anthropic_messages(gw, session: str) -> None:
    sdk = anthropic.Anthropic(base_url=gw.url, api_key=f"sk-tap-{session}", max_retries=0)
    messages: list = [{"role": "user", "content": QUESTION}]
    common = {"model": "claude-tiny", "system": SYSTEM, "max_tokens": MAX_TOKENS}
    for follow_up in FOLLOW_UPS:
        answer = sdk.messages.create(messages=messages, **common)
        messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]},
                     {"role": "user", "content": follow_up}]
    sdk.messages.create(messages=messages, **common)


def gemini(gw, session: str) -> None:
    sdk = genai.Client(api_key=f"sk-tap-{session}", http_options=types.HttpOptions(base_url=gw.url))
    config = types.GenerateContentConfig(system_instruction=SYSTEM, max_output_tokens=MAX_TOKENS, temperature=0)
    history: list = [types.Content(role="user", parts=[types.Part(text=QUESTION)])]
    for follow_up in FOLLOW_UPS:
        answer = sdk.models.generate_content(model="gemini-2.5-flash", contents=history, config=config)
        history += [answer.candidates[0].content, types.Content(role="user", parts=[types.Part(text=follow_up)])]
    sdk.models.generate_content(model="gemini-2.5-flash", contents=history, config=config)


SESSIONS = {"openai_chat": openai_chat, "openai_responses": openai_responses,
            "anthropic_messages": anthropic_messages, "gemini": gemini}


def assert_zero_drift(gw, vllm, session: str, calls: int) -> list[dict]:
    """One chain, no break, no drift; each later prompt starts with the previous prompt + sampled ids."""
    stored = rows(gw, session)
    assert [row["status"] for row in stored] == ["ok"] * calls
    for earlier, later in zip(stored, stored[1:], strict=False):
        head = list(earlier["prompt_token_ids"]) + list(earlier["completion_token_ids"])
        assert list(later["prompt_token_ids"][:len(head)]) == head
        assert json.loads(later["metadata_json"])["continues"] == earlier["completion_id"]
    sid = f"sk-tap-{session}"
    # the served name says nothing of Qwen and turns cut at `length` sample no end of turn: name it
    stats = build(gw.store, "prefix_merging", [sid], IM_END_ID, decode=vllm.detokenize).session_stats[sid]
    assert (stats["chains"], stats["segments"], stats["drift_tokens"]) == (1, 1, 0)
    assert [trace["tokenization"] for trace in trace_metadata(gw.store, sid)] == ["gateway"]
    return stored


def test_forced_tool_session_merges_with_zero_drift(gw, vllm):
    """The forced session (in upstream mode its tags come back re-tokenized): continued verbatim here."""
    run_tool_session(gw, "gw-tool-session")
    stored = assert_zero_drift(gw, vllm, "gw-tool-session", 3)
    assert [row["finish_reason"] for row in stored][:2] == ["tool_calls", "tool_calls"]


@pytest.mark.parametrize("api", list(SESSIONS))
def test_multi_turn_sessions_merge_with_zero_drift(gw, vllm, api):
    SESSIONS[api](gw, f"gw-{api}")
    assert_zero_drift(gw, vllm, f"gw-{api}", 3)
