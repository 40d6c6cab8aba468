"""`tracetap gateway --upstream` in front of a real vLLM: what the store keeps is what vLLM computed.

Each official SDK (OpenAI chat and responses, Anthropic, google-genai) calls the gateway with and without
a stream; every stored prompt must be vLLM's own `/tokenize` of the chat request the gateway sent, and a
multi-turn tool session must show the drift vLLM's re-tokenization of sampled turns causes.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import anthropic
import live
import openai
import pytest
from google import genai
from google.genai import types
from tracetap.builders import build
from tracetap.store import connect

SYSTEM = "You are terse."
QUESTION = "List the files here."
MAX_TOKENS = 12
TAG_IDS = {151657, 151658}  # the special tokens `<tool_call>` and `</tool_call>`
BASH = {"name": "Bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
# vLLM keeps only these of a chat request when it renders the prompt (the rest steer sampling)
RENDER_FIELDS = ("messages", "tools", "add_generation_prompt", "continue_final_message", "chat_template",
                 "chat_template_kwargs", "add_special_tokens")


@pytest.fixture(scope="module")
def gw(vllm, tmp_path_factory):
    with live.start_gateway(tmp_path_factory.mktemp("vllm-upstream") / "store", "--upstream", vllm.url) as process:
        yield process


def rows(gw, session: str) -> list[dict]:
    return live.store_rows(gw.store, "session_id = ?", [f"sk-tap-{session}"])


def rendered_by_vllm(vllm, row: dict) -> list[int]:
    """vLLM's `/tokenize` of the chat request the gateway sent upstream for this call."""
    sent = json.loads(row["chat_request_json"])
    return vllm.tokenize({key: sent[key] for key in RENDER_FIELDS if key in sent})


def assert_exact(vllm, row: dict, api: str, stream: bool) -> None:
    """A recorded call with aligned token data whose prompt is vLLM's own rendering of the sent request."""
    assert (row["status"], row["api"], row["stream"], row["error"]) == ("ok", api, stream, None)
    assert len(row["logprobs"]) == len(row["completion_token_ids"]) == row["completion_tokens"] > 0
    assert all(logprob <= 0 for logprob in row["logprobs"])
    assert row["served_model"] == "tiny"
    assert len(row["prompt_token_ids"]) == row["prompt_tokens"]
    assert row["prompt_token_ids"] == rendered_by_vllm(vllm, row)


def openai_chat(gw, session: str, stream: bool) -> str:
    sdk = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-{session}", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    common = {"model": "tiny", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 1, "seed": 7,
              "tools": [{"type": "function", "function": BASH}]}
    if not stream:
        return sdk.chat.completions.create(**common).choices[0].message.content or ""
    return "".join(chunk.choices[0].delta.content or "" for chunk in sdk.chat.completions.create(**common, stream=True)
                   if chunk.choices)


def openai_responses(gw, session: str, stream: bool) -> str:
    sdk = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-{session}", max_retries=0)
    common = {"model": "tiny", "instructions": SYSTEM, "input": QUESTION, "max_output_tokens": MAX_TOKENS,
              "temperature": 1, "tools": [{"type": "function", **BASH}]}
    if not stream:
        return sdk.responses.create(**common).output_text
    with sdk.responses.stream(**common) as events:
        return events.get_final_response().output_text


def anthropic_messages(gw, session: str, stream: bool) -> str:
    sdk = anthropic.Anthropic(base_url=gw.url, api_key=f"sk-tap-{session}", max_retries=0)
    tool = {"name": BASH["name"], "description": BASH["description"], "input_schema": BASH["parameters"]}
    common = {"model": "claude-tiny", "system": SYSTEM, "max_tokens": MAX_TOKENS,
              "messages": [{"role": "user", "content": QUESTION}], "tools": [tool]}
    if not stream:
        message = sdk.messages.create(**common)
    else:
        with sdk.messages.stream(**common) as events:
            message = events.get_final_message()
    return "".join(block.text for block in message.content if block.type == "text")


def gemini(gw, session: str, stream: bool) -> str:
    sdk = genai.Client(api_key=f"sk-tap-{session}", http_options=types.HttpOptions(base_url=gw.url))
    config = types.GenerateContentConfig(
        system_instruction=SYSTEM, max_output_tokens=MAX_TOKENS, temperature=1,
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(**BASH)])])
    common = {"model": "gemini-2.5-flash", "contents": QUESTION, "config": config}
    if not stream:
        return gemini_text(sdk.models.generate_content(**common))
    return "".join(gemini_text(chunk) for chunk in sdk.models.generate_content_stream(**common))


def gemini_text(response: types.GenerateContentResponse) -> str:
    parts = response.candidates[0].content.parts or [] if response.candidates else []
    return "".join(part.text or "" for part in parts)


CALLERS: dict[str, Callable[..., str]] = {"openai_chat": openai_chat, "openai_responses": openai_responses,
                                          "anthropic_messages": anthropic_messages, "gemini": gemini}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("api", list(CALLERS))
def test_every_api_records_vllms_own_tokens(gw, vllm, api, stream):
    session = f"{api}-{'stream' if stream else 'json'}"
    text = CALLERS[api](gw, session, stream)
    [row] = rows(gw, session)
    assert_exact(vllm, row, api, stream)
    # what the SDK got is the text vLLM sampled (a random model: gibberish, but the same gibberish)
    upstream = json.loads(row["chat_response_json"])["choices"][0]["message"]
    assert text == (upstream["content"] or "")


def trace_metadata(store, session_id: str) -> list[dict]:
    """The metadata of the session's prefix_merging traces, in trace order."""
    query = ("SELECT metadata_json FROM trajectories WHERE builder = 'prefix_merging' AND session_id = ? "
             "ORDER BY trace_index")
    return [json.loads(text) for (text,) in connect(store).execute(query, [session_id]).fetchall()]


def forced_bash(command: str) -> dict:
    """vLLM's structured outputs forcing one Hermes `<tool_call>` (the random model never makes one itself);
    `command` goes into the regex as is, so it holds no regex syntax."""
    call = r'<tool_call>\n\{"name": "Bash", "arguments": \{"command": "' + command + r'"\}\}\n</tool_call>'
    return {"structured_outputs": {"regex": call}}


def run_tool_session(gw, session: str) -> None:
    """Two forced Bash calls, each answered with a tool result, then a free answer (OpenAI chat SDK)."""
    sdk = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-{session}", max_retries=0)
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    common = {"model": "tiny", "tools": [{"type": "function", "function": BASH}], "temperature": 0}
    for command, output in (("ls", "a.py\nb.py"), ("cat notes", "hello")):
        message = sdk.chat.completions.create(messages=messages, max_tokens=60, extra_body=forced_bash(command),
                                              **common).choices[0].message
        [call] = message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("Bash", {"command": command})
        result = {"role": "tool", "tool_call_id": call.id, "content": output}
        messages += [message.model_dump(exclude_none=True), result]
    sdk.chat.completions.create(messages=messages, max_tokens=MAX_TOKENS, **common)


def assert_same_text_other_ids(vllm, calls: list[dict], drift: list[dict]) -> None:
    """Every drift span: the sampled ids and their copy in the next prompt are one text in other ids."""
    by_id = {call["completion_id"]: call for call in calls}
    for span in drift:
        sampled = by_id[span["completion_id"]]["completion_token_ids"][slice(*span["sampled"])]
        copy = by_id[span["next_completion_id"]]["prompt_token_ids"][slice(*span["copy"])]
        assert vllm.detokenize(sampled) == vllm.detokenize(copy) and sampled != copy


def test_tool_session_reports_the_drift_of_re_tokenized_turns(gw, vllm):
    """vLLM samples parts of the forced `<tool_call>` turn as text pieces (tags included) and the next
    prompt re-renders them canonically, so no later prompt is the previous prompt + its sampled ids:
    the build keeps one chain and reports that drift as tokenization drift."""
    run_tool_session(gw, "tool-session")
    calls = rows(gw, "tool-session")
    for call in calls:
        assert_exact(vllm, call, "openai_chat", False)
    assert [call["finish_reason"] for call in calls][:2] == ["tool_calls", "tool_calls"]
    turns = [call["prompt_token_ids"] + call["completion_token_ids"] for call in calls]
    assert [later["prompt_token_ids"][:len(turn)] != turn for later, turn in zip(calls[1:], turns, strict=False)] \
        == [True, True]  # checked here, before asking the builder

    stats = build(gw.store, "prefix_merging", decode=vllm.detokenize).session_stats["sk-tap-tool-session"]
    (trace,) = trace_metadata(gw.store, "sk-tap-tool-session")
    drift = trace["trace"]["drift"]
    assert (stats["chains"], stats["break_reasons"], stats["completions_merged"]) == (1, {}, 2) and drift
    assert stats["drift_tokens_by_kind"] == {"tokenization": sum(span["tokens"] for span in drift)}
    ids = [call["completion_id"] for call in calls]
    pairs = {(span["completion_id"], span["next_completion_id"]) for span in drift}
    assert pairs == set(zip(ids, ids[1:], strict=False))
    assert_same_text_other_ids(vllm, calls, drift)
    # in each forced call a tag sampled as text pieces comes back as its special token in the next prompt
    tagged = {span["completion_id"] for span in drift
              if TAG_IDS & set(calls[ids.index(span["next_completion_id"])]["prompt_token_ids"][slice(*span["copy"])])}
    assert tagged == set(ids[:2])
