"""`tracetap gateway --upstream` in front of a real vLLM: what the store keeps is what vLLM computed.

Each official SDK (OpenAI chat and responses, Anthropic, google-genai) calls the gateway with and without
a stream; every stored prompt must be vLLM's own `/tokenize` of the chat request the gateway sent, and a
multi-turn tool session must show the drift vLLM's re-tokenization of sampled turns causes.
"""

from __future__ import annotations

import json

import live
import pytest
from tracetap.builders import build
from vllm_calls import CALLERS, rows, run_tool_session, trace_metadata

TAG_IDS = {151657, 151658}  # the special tokens `<tool_call>` and `</tool_call>`
# vLLM keeps only these of a chat request when it renders the prompt (the rest steer sampling)
RENDER_FIELDS = ("messages", "tools", "add_generation_prompt", "continue_final_message", "chat_template",
                 "chat_template_kwargs", "add_special_tokens")


@pytest.fixture(scope="module")
def gw(vllm, tmp_path_factory):
    with live.start_gateway(tmp_path_factory.mktemp("vllm-upstream") / "store", "--upstream", vllm.url) as process:
        yield process


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
