"""per_request: one trace per ok completion, built through the real store."""

from __future__ import annotations

import pytest
from toychat import Conversation, completion, failure
from tracestore import read_completions, read_traces, write_store
from tracetap.builders import build

BUILDER = "per_request"


def session_rows() -> list[dict]:
    chat = Conversation([10]).say("user", [20])
    rows = [chat.ask([30], "tool_calls")]
    chat.say("tool", [40])
    rows += [failure(502), chat.ask([31, 32], "length", logprobs=False)]
    chat.say("user", [21])
    rows.append(chat.ask([33]))
    rows[-1]["logprobs"] = rows[-1]["logprobs"][:-1]  # not aligned with the sampled ids
    return rows


def test_one_trace_per_ok_completion_exactly_as_sampled(tmp_path):
    write_store(tmp_path, session_rows())
    summary = build(tmp_path, BUILDER)
    traces, stored = read_traces(tmp_path, BUILDER), read_completions(tmp_path)
    ok = [row for row in stored if row["status"] == "ok"]
    assert [t["completion_ids"] for t in traces] == [[row["completion_id"]] for row in ok]
    for trace, row in zip(traces, ok, strict=True):
        assert trace["prompt_token_ids"] == row["prompt_token_ids"]
        assert trace["response_token_ids"] == row["completion_token_ids"]
        assert trace["loss_mask"] == [1] * len(row["completion_token_ids"])
        assert trace["finish_reason"] == row["finish_reason"]
        assert (trace["chain_index"], trace["segment_index"], trace["break_reason"]) == (None, None, None)
    assert traces[0]["response_logprobs"] == pytest.approx(ok[0]["logprobs"])
    assert [t["response_logprobs"] for t in traces[1:]] == [None, None]  # missing, then misaligned
    assert [t["trace_index"] for t in traces] == [0, 1, 2]
    assert summary.traces == 3 and summary.session_stats["s1"]["completions"] == 4


def test_ok_call_without_ids_becomes_an_error_trace_and_flags_follow_the_session(tmp_path):
    rows = session_rows()[:1] + [{**completion([1], [2], "abort"), "completion_token_ids": None}]
    write_store(tmp_path, rows)
    build(tmp_path, BUILDER)
    traces = read_traces(tmp_path, BUILDER)
    assert [t["status"] for t in traces] == ["not_trainable", "error"]
    assert traces[1]["metadata"]["error"] == "missing_token_ids"
    assert traces[0]["metadata"]["stats"]["not_trainable_reasons"] == ["aborted_completion"]


@pytest.mark.parametrize("builder", ["per_request", "prefix_merging"])
def test_degraded_calls_are_never_trained_on_and_are_counted(tmp_path, builder):
    chat = Conversation([10]).say("user", [20])
    good = chat.ask([30])
    chat.say("user", [21])
    degraded = {**chat.ask([31]), "status": "degraded", "error": "upstream sent no prompt_token_ids"}
    write_store(tmp_path, [good, degraded])
    summary = build(tmp_path, builder)
    traces = read_traces(tmp_path, builder)
    held = {cid for trace in traces for cid in trace["completion_ids"]}
    ids = {row["status"]: row["completion_id"] for row in read_completions(tmp_path)}
    assert ids["degraded"] not in held and ids["ok"] in held
    assert summary.degraded == 1 and summary.session_stats["s1"]["completions_degraded"] == 1
