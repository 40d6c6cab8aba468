"""prefix_merging edge cases, each built through the real store (writer in, DuckDB out)."""

from __future__ import annotations

import pytest
from toychat import EOT, GENERATION_PROMPT, NL, START, Conversation, completion, decode, failure, render
from tracestore import read_completions, read_traces, write_store
from tracetap.builders import build

BUILDER = "prefix_merging"


@pytest.fixture
def store_root(tmp_path):
    return tmp_path / "store"


def run(root, rows, **kwargs) -> tuple[list[dict], list[dict], dict]:
    """(traces, completions as stored, session stats) after building `rows` into a fresh store."""
    write_store(root, rows)
    summary = build(root, BUILDER, **{"decode": decode, **kwargs})
    sid = rows[0]["session_id"]
    return read_traces(root, BUILDER, sid), read_completions(root, sid), summary.session_stats[sid]


def stream(trace: dict) -> list[int]:
    return trace["prompt_token_ids"] + trace["response_token_ids"]


def span_tokens(trace: dict) -> dict[str, list[int]]:
    """Sampled ids at each recorded span, by completion id."""
    response = trace["response_token_ids"]
    spans = trace["metadata"]["spans"]
    return {s["completion_id"]: response[s["start"]:s["start"] + s["length"]] for s in spans}


def tool_session() -> tuple[Conversation, list[dict]]:
    """A tool-using agent: call, result, call, result, final answer; one turn re-renders differently."""
    chat = Conversation([10, 11]).say("user", [20, 21])
    rows = [chat.ask([30, 31], "tool_calls", canonical=[90])]  # re-rendered: the same text in one token
    chat.say("tool", [40, 41])
    rows.append(chat.ask([32], "tool_calls"))
    chat.say("tool", [42]).say("user", [22])
    rows.append(chat.ask([33, 34]))
    return chat, rows


def test_linear_session_is_one_trace_equal_to_final_prompt_with_sampled_spans(store_root):
    chat, rows = tool_session()
    traces, stored, stats = run(store_root, rows)
    assert len(traces) == 1
    trace = traces[0]
    assert stream(trace) == chat.expected_stream(rows[-1])
    assert trace["prompt_token_ids"] == rows[0]["prompt_token_ids"]
    assert trace["completion_ids"] == [row["completion_id"] for row in stored]
    assert span_tokens(trace) == {row["completion_id"]: row["completion_token_ids"] for row in stored}
    assert (trace["chain_index"], trace["segment_index"], trace["break_reason"]) == (0, 0, None)
    assert trace["status"] == "ok" and trace["finish_reason"] == "stop"
    assert stats["break_reasons"] == {} and stats["drift_tokens_by_kind"] == {"tokenization": 2}
    assert (stats["chains"], stats["segments"], stats["completions_merged"]) == (1, 1, 2)
    assert stats["eot_id"] == EOT and stats["eot_source"] == "detected"
    assert trace["metadata"]["stats"] == stats


def test_logprobs_real_on_sampled_tokens_and_zero_on_interstitials(store_root):
    _, rows = tool_session()
    (trace,), stored, _ = run(store_root, rows)
    logprobs, mask = trace["response_logprobs"], trace["loss_mask"]
    for span, row in zip(trace["metadata"]["spans"], stored, strict=True):
        assert logprobs[span["start"]:span["start"] + span["length"]] == pytest.approx(row["logprobs"])
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)
    assert sum(mask) == sum(len(row["completion_token_ids"]) for row in stored)


@pytest.mark.parametrize("broken", ["missing", "misaligned"])
def test_one_call_without_aligned_logprobs_nulls_the_whole_trace(store_root, broken):
    _, rows = tool_session()
    rows[1]["logprobs"] = None if broken == "missing" else rows[1]["logprobs"] + [-1.0]
    (trace,), _, _ = run(store_root, rows)
    assert trace["response_logprobs"] is None
    assert len(trace["loss_mask"]) == len(trace["response_token_ids"])


def test_truncated_turn_gets_the_canonical_end_of_turn_with_mask_0(store_root):
    chat = Conversation([10]).say("user", [20])
    rows = [chat.ask([30, 31, 32], "length")]  # cut at max_tokens: no end-of-turn sampled
    chat.say("user", [21])
    rows.append(chat.ask([33]))
    (trace,), _, stats = run(store_root, rows)
    assert stream(trace) == chat.expected_stream(rows[-1])
    response, mask = trace["response_token_ids"], trace["loss_mask"]
    assert response[:4] == [30, 31, 32, EOT] and mask[:4] == [1, 1, 1, 0]
    assert sum(mask) == 3 + 2 and stats["break_reasons"] == {}


@pytest.mark.parametrize("earlier_turns", [0, 1])
def test_empty_truncation_dropped_by_the_harness_is_left_out(store_root, earlier_turns):
    chat = Conversation([10]).say("user", [20])
    rows = []
    for turn in range(earlier_turns):
        rows.append(chat.ask([30 + turn]))
        chat.say("user", [21])
    truncated = chat.ask([], "length", keep=False, reasoning=[50, 51, 52])  # only reasoning: nothing shown
    rows.append(truncated)
    chat.say("user", [22])  # the harness nudges instead of keeping the empty turn
    rows.append(chat.ask([35]))
    traces, stored, stats = run(store_root, rows)
    assert len(traces) == 1 and stats["break_reasons"] == {}
    trace = traces[0]
    assert stream(trace) == chat.expected_stream(rows[-1])
    dropped = stored[earlier_turns]["completion_id"]
    assert dropped not in trace["completion_ids"]
    assert trace["metadata"]["trace"]["empty_truncation_ids"] == [dropped]
    assert stats["empty_truncations"] == 1 and stats["completions_preserved"] == len(rows) - 1


def test_history_rewrite_starts_a_new_segment_and_keeps_everything(store_root):
    chat, rows = tool_session()
    chat.messages[3] = ("tool", [0])  # the harness clears an old tool result
    chat.spoken[3] = ("tool", [0])
    chat.say("user", [23])
    rows.append(chat.ask([36]))
    chat.say("user", [24])
    rows.append(chat.ask([37]))
    traces, stored, stats = run(store_root, rows)
    assert [(t["chain_index"], t["segment_index"], t["break_reason"]) for t in traces] == [
        (0, 0, None), (0, 1, "canonical_prefix_break")]
    assert traces[0]["completion_ids"] + traces[1]["completion_ids"] == [r["completion_id"] for r in stored]
    assert traces[1]["prompt_token_ids"] == rows[3]["prompt_token_ids"]
    # the new segment's prompt is the rewritten history as the harness sent it (turns re-rendered)
    assert stream(traces[1]) == rows[-1]["prompt_token_ids"] + rows[-1]["completion_token_ids"]
    assert stats["break_reasons"] == {"canonical_prefix_break": 1} and stats["segments"] == 2


def test_compaction_continues_the_chain_as_a_new_segment(store_root):
    chat, rows = tool_session()
    compacted = Conversation([10, 11]).say("user", [90, 91, 92])  # same agent, history summarized
    rows.append(compacted.ask([38]))
    traces, _, stats = run(store_root, rows)
    assert [(t["chain_index"], t["break_reason"]) for t in traces] == [
        (0, None), (0, "canonical_prefix_break")]
    assert stats["chains"] == 1


def test_no_end_of_turn_in_the_next_prompt_breaks_with_its_reason(store_root):
    first = completion(render([("system", [10]), ("user", [20])]), [30, EOT])
    glued = completion(first["prompt_token_ids"] + [30, NL, 60] + GENERATION_PROMPT, [31, EOT])
    traces, stored, stats = run(store_root, [first, glued])
    assert [t["break_reason"] for t in traces] == [None, "interstitial_split_failed"]
    assert [t["completion_ids"] for t in traces] == [[row["completion_id"]] for row in stored]
    assert traces[1]["prompt_token_ids"] == glued["prompt_token_ids"]


def truncated_only() -> tuple[Conversation, list[dict]]:
    chat = Conversation([10]).say("user", [20])
    rows = [chat.ask([30, 31], "length")]
    chat.say("user", [21])
    rows.append(chat.ask([32, 33], "length"))
    chat.say("user", [22])
    rows.append(chat.ask([34], "length"))
    return chat, rows


@pytest.mark.parametrize(("eot_id", "expected"), [
    (None, {"segments": 3, "break_reasons": {"eot_unavailable": 2}, "eot_source": None}),
    (EOT, {"segments": 1, "break_reasons": {}, "eot_source": "configured"}),
])
def test_end_of_turn_configured_or_each_call_kept_as_its_own_segment(store_root, eot_id, expected):
    chat, rows = truncated_only()
    traces, _, stats = run(store_root, rows, eot_id=eot_id)
    assert {key: stats[key] for key in expected} == expected
    assert sum(len(t["completion_ids"]) for t in traces) == 3
    if eot_id is not None:
        assert stream(traces[0]) == chat.expected_stream(rows[-1])


def test_interleaved_conversations_become_separate_chains(store_root):
    main = Conversation([10, 11]).say("user", [20])
    sub = Conversation([12, 13]).say("user", [25])
    rows = [main.ask([30], "tool_calls"), sub.ask([50])]
    main.say("tool", [40])
    sub.say("user", [26])
    rows += [sub.ask([51]), main.ask([31])]
    traces, _, stats = run(store_root, rows)
    assert (stats["chains"], stats["segments"], stats["break_reasons"]) == (2, 2, {})
    assert stream(traces[0]) == main.expected_stream(rows[3])
    assert stream(traces[1]) == sub.expected_stream(rows[2])


def test_sub_agents_sharing_a_system_prompt_stay_separate(store_root):
    first, second = Conversation([12]).say("user", [25]), Conversation([12]).say("user", [26])
    rows = [first.ask([50]), second.ask([60])]
    first.say("user", [27])
    second.say("user", [28])
    rows += [first.ask([51]), second.ask([61])]
    traces, _, stats = run(store_root, rows)
    assert (stats["chains"], stats["break_reasons"]) == (2, {})
    assert [stream(t) for t in traces] == [first.expected_stream(rows[2]), second.expected_stream(rows[3])]


def test_parallel_branches_from_one_prompt_become_separate_chains(store_root):
    left, right = Conversation([10]).say("user", [20]), Conversation([10]).say("user", [20])
    rows = [left.ask([30]), right.ask([31])]  # same prompt, two samples
    left.say("user", [21])
    right.say("user", [21])
    rows += [right.ask([32]), left.ask([33])]
    traces, _, stats = run(store_root, rows)
    assert (stats["chains"], stats["retries"], stats["drift_tokens"]) == (2, 0, 0)
    assert [stream(t) for t in traces] == [left.expected_stream(rows[3]), right.expected_stream(rows[2])]


def test_fork_from_an_earlier_prompt_starts_its_own_chain(store_root):
    chat, rows = tool_session()
    rows.append(completion(rows[1]["prompt_token_ids"], [70, EOT]))  # rewound to turn 2
    traces, stored, stats = run(store_root, rows)
    assert [(t["chain_index"], t["break_reason"]) for t in traces] == [(0, None), (1, None)]
    assert traces[1]["completion_ids"] == [stored[3]["completion_id"]]
    assert stats["retries"] == 0


def test_longest_matching_tip_wins(store_root):
    chat, rows = tool_session()
    rows.append(completion(rows[1]["prompt_token_ids"], [70, EOT]))  # a fork opens a chain at turn 2
    chat.say("user", [23])
    rows.append(chat.ask([36]))  # extends both tips (the fork's is shorter): the main chain wins
    traces, stored, stats = run(store_root, rows)
    main_ids = [row["completion_id"] for i, row in enumerate(stored) if i != 3]
    assert [t["completion_ids"] for t in traces] == [main_ids, [stored[3]["completion_id"]]]
    assert stream(traces[0]) == chat.expected_stream(rows[-1])
    assert (stats["chains"], stats["retries"], stats["break_reasons"]) == (2, 0, {})


@pytest.mark.parametrize("continued_from", [None, "last"])
def test_retry_keeps_the_attempt_the_history_continues_else_the_last(store_root, continued_from):
    chat = Conversation([10]).say("user", [20])
    first = chat.ask([30], keep=False)
    second = chat.ask([31])  # same prompt again: the harness retried
    rows = [first, second]
    if continued_from:
        chat.say("user", [21])
        rows.append(chat.ask([32]))
    traces, stored, stats = run(store_root, rows)
    assert len(traces) == 1 and stats["retries"] == 1
    ids = [row["completion_id"] for row in stored]
    assert traces[0]["completion_ids"] == ids[1:]
    assert traces[0]["metadata"]["trace"]["retried_completion_ids"] == [ids[0]]
    assert stream(traces[0]) == chat.expected_stream(rows[-1])


def test_a_later_attempt_at_a_prompt_whose_first_attempt_continued_is_no_retry(store_root):
    chat = Conversation([10]).say("user", [20])
    other = Conversation([10]).say("user", [20])
    rows = [chat.ask([30]), other.ask([31])]  # a parallel sample after the one the history continues
    chat.say("user", [21])
    rows.append(chat.ask([32]))
    traces, stored, stats = run(store_root, rows)
    ids = [row["completion_id"] for row in stored]
    assert [t["completion_ids"] for t in traces] == [[ids[0], ids[2]], [ids[1]]]
    assert (stats["chains"], stats["retries"], stats["drift_tokens"]) == (2, 0, 0)
    assert stream(traces[0]) == chat.expected_stream(rows[2])
    assert stream(traces[1]) == other.expected_stream(rows[1])


@pytest.mark.parametrize(("rows_after", "reasons"), [
    ([{"finish_reason": "abort"}], ["aborted_completion"]),
    ([{"policy_version": "v2"}], ["mixed_policy_versions"]),
    ([failure(502)], ["truncated_by_upstream_failure"]),
    ([failure(504, "timeout")], ["truncated_by_upstream_failure"]),
    ([failure(400)], []),
    ([failure(502), {}], []),
])
def test_trainability_flags_every_trace_of_the_session(store_root, rows_after, reasons):
    chat = Conversation([10]).say("user", [20])
    rows = [chat.ask([30], policy_version="v1")]
    for extra in rows_after:
        if "status" in extra:
            rows.append(extra)
            continue
        chat.say("user", [21])
        rows.append(chat.ask([31], **{"policy_version": "v1", **extra}))
    traces, _, stats = run(store_root, rows)
    assert stats["not_trainable_reasons"] == reasons
    assert {t["status"] for t in traces} == {"not_trainable" if reasons else "ok"}
    assert all(t["metadata"]["stats"]["not_trainable_reasons"] == reasons for t in traces)


def test_ok_call_without_token_ids_is_kept_as_an_error_trace(store_root):
    chat, rows = tool_session()
    rows.insert(1, {**completion([START], [EOT]), "prompt_token_ids": None, "completion_token_ids": None})
    traces, stored, stats = run(store_root, rows)
    assert [t["status"] for t in traces] == ["ok", "error"]
    assert traces[1]["completion_ids"] == [stored[1]["completion_id"]]
    assert traces[1]["metadata"]["error"] == "missing_token_ids"
    assert stats["completions_without_ids"] == 1 and stats["traces"] == 2
