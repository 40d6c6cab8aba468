"""Builders on sessions captured for real: a `tracetap gateway` process with the scripted embedded
engine, driven by the demo agent (official `openai` SDK, tools run in a workspace)."""

from __future__ import annotations

import live
import pytest
from tracestore import read_completions, read_traces
from tracetap.builders import build

from tracetap.agent import run_agent

SCRIPT = [
    {"content": "Let me look around.",
     "tool_calls": [{"function": {"name": "run_shell", "arguments": {"command": "ls"}}}]},
    {"content": None, "reasoning": "A note file would help.",
     "tool_calls": [{"function": {"name": "write_file", "arguments": {"path": "n.txt", "content": "hi\n"}}}]},
    {"content": "Checking it.",
     "tool_calls": [{"function": {"name": "run_shell", "arguments": {"command": "cat n.txt"}}}]},
    {"content": "Done: n.txt says hi."},
]


@pytest.fixture(scope="module")
def captured(tmp_path_factory, tracetap_home):
    root = tmp_path_factory.mktemp("captured")
    (root / "work").mkdir()
    with live.scripted_gateway(root, SCRIPT) as gateway:
        run = run_agent(f"{gateway.url}/v1", "sk-tap-live-1", "Leave a note.", root / "work")
    assert run.turns == len(SCRIPT) and run.final_message == SCRIPT[-1]["content"]
    return root / "store"


def test_tool_using_session_merges_into_one_trace_with_no_break(captured):
    summary = build(captured, "prefix_merging")
    stats = summary.session_stats["sk-tap-live-1"]
    assert (stats["chains"], stats["segments"], stats["break_reasons"]) == (1, 1, {})
    (trace,) = read_traces(captured, "prefix_merging", "sk-tap-live-1")
    calls = read_completions(captured, "sk-tap-live-1")
    assert trace["completion_ids"] == [call["completion_id"] for call in calls]
    assert trace["prompt_token_ids"] == calls[0]["prompt_token_ids"]
    response, mask, logprobs = trace["response_token_ids"], trace["loss_mask"], trace["response_logprobs"]
    for span, call in zip(trace["metadata"]["spans"], calls, strict=True):
        window = slice(span["start"], span["start"] + span["length"])
        assert response[window] == call["completion_token_ids"] and set(mask[window]) == {1}
        assert logprobs[window] == pytest.approx(call["logprobs"])
    assert sum(mask) == sum(len(call["completion_token_ids"]) for call in calls)
    assert (stats["eot_id"], stats["eot_source"], trace["status"]) == (151645, "detected", "ok")
    # the template re-renders every scripted turn exactly as sampled (reasoning included), so each
    # later prompt is the merged stream up to where that call's sampled ids begin
    assert stats["drift_tokens"] == 0
    stream = trace["prompt_token_ids"] + response
    for span, call in zip(trace["metadata"]["spans"][1:], calls[1:], strict=True):
        assert stream[:len(trace["prompt_token_ids"]) + span["start"]] == call["prompt_token_ids"]


def test_per_request_gives_one_trace_per_call(captured):
    summary = build(captured, "per_request")
    traces = read_traces(captured, "per_request", "sk-tap-live-1")
    assert summary.traces == len(traces) == len(SCRIPT)
    for trace in traces:
        assert trace["loss_mask"] == [1] * len(trace["response_token_ids"]) and trace["response_logprobs"]
