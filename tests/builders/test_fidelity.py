"""prefix_merging on the shapes real harness sessions take (issue 8 §6), hand-built with the toy template:
parallel attempts, thinking disabled, identical sub-agent threads, drift kinds, break points."""

from __future__ import annotations

import pytest
from test_prefix_merging import run, stream, tool_session
from toychat import EOT, GENERATION_PROMPT, NL, THINKING_OFF, Conversation, render


@pytest.fixture
def store_root(tmp_path):
    return tmp_path / "store"


def test_continuation_pairs_with_the_attempt_it_repeats_verbatim(store_root):
    chat = Conversation([10]).say("user", [20])
    other = Conversation([10]).say("user", [20])
    a = chat.ask([30, 31], "tool_calls")
    b = other.ask([30, 31, 32], "tool_calls")  # same prompt, all of A's tokens and more
    chat.say("tool", [40])
    rows = [a, b, chat.ask([33])]  # the history continues A
    traces, stored, stats = run(store_root, rows)
    ids = [row["completion_id"] for row in stored]
    assert [t["completion_ids"] for t in traces] == [[ids[0], ids[2]], [ids[1]]]
    assert stream(traces[0]) == chat.expected_stream(rows[2])
    assert (stats["chains"], stats["retries"], stats["drift_tokens"], stats["break_reasons"]) == (2, 0, 0, {})


def test_thinking_disabled_session_merges_with_the_empty_block_counted_as_template_drift(store_root):
    chat = Conversation([10], thinking=False).say("user", [20])
    rows = [chat.ask([30], "tool_calls")]
    chat.say("tool", [40])
    rows.append(chat.ask([31], "tool_calls"))
    chat.say("tool", [41])
    rows.append(chat.ask([32]))
    first_prompt = rows[0]["prompt_token_ids"]
    assert rows[1]["prompt_token_ids"][:len(first_prompt)] != first_prompt  # the block is not re-rendered
    (trace,), stored, stats = run(store_root, rows)
    assert trace["completion_ids"] == [row["completion_id"] for row in stored]
    assert (stats["segments"], stats["break_reasons"], trace["status"]) == (1, {}, "ok")
    assert stats["drift_tokens_by_kind"] == {"template": 2 * (len(THINKING_OFF) - len(GENERATION_PROMPT))}
    # every sampled turn follows the block, as it did when sampled; the interstitials are the new messages
    blocked = [*render([("system", [10]), ("user", [20])], thinking=False),
               30, EOT, NL, *render([("tool", [40])], thinking=False),
               31, EOT, NL, *render([("tool", [41])], thinking=False), 32, EOT]
    assert stream(trace) == blocked
    spans = trace["metadata"]["trace"]["drift"]
    assert [(s["kind"], s["sampled"]) for s in spans] == [("template", [-4, 0])] * 2


def test_identical_sub_agent_threads_stay_two_chains(store_root):
    threads = [Conversation([10]).say("user", [20]) for _ in range(2)]
    rows = []
    for step, reply in enumerate([[40], [41], None]):
        for thread in threads:  # both sub-agents ask the same, get the same answer
            rows.append(thread.ask([30 + step], "tool_calls" if reply else "stop"))
        for thread in threads:
            if reply:
                thread.say("tool", reply)
    traces, stored, stats = run(store_root, rows)
    assert (stats["chains"], stats["retries"], stats["completions_preserved"]) == (2, 0, 6)
    assert sorted(len(t["completion_ids"]) for t in traces) == [3, 3]
    assert sorted(c for t in traces for c in t["completion_ids"]) == sorted(r["completion_id"] for r in stored)
    assert [stream(t) for t in traces] == [threads[0].expected_stream(rows[-1])] * 2


def test_tokenization_drift_is_a_span_of_the_same_text_and_stays_trainable(store_root):
    (trace,), stored, stats = run(store_root, tool_session()[1])
    (span,) = trace["metadata"]["trace"]["drift"]
    assert span == {"completion_id": stored[0]["completion_id"], "next_completion_id": stored[1]["completion_id"],
                    "kind": "tokenization", "sampled": [0, 2],
                    "copy": [len(stored[0]["prompt_token_ids"]), len(stored[0]["prompt_token_ids"]) + 1],
                    "tokens": 2}
    assert stored[1]["prompt_token_ids"][span["copy"][0]] == 90  # the one id for the sampled [30, 31]
    assert trace["status"] == "ok" and stats["trainable"]


def dropped_thoughts() -> tuple[Conversation, list[dict]]:
    """A harness that drops the thought part of each turn from its history (Gemini CLI)."""
    chat = Conversation([10]).say("user", [20])
    rows = [chat.ask([30], "tool_calls", reasoning=[50, 51, 52])]
    chat.say("tool", [40])
    rows.append(chat.ask([31]))
    return chat, rows


def test_content_drift_is_flagged_and_the_trace_not_trainable(store_root):
    (trace,), stored, stats = run(store_root, dropped_thoughts()[1])
    (span,) = trace["metadata"]["trace"]["drift"]
    at = len(stored[0]["prompt_token_ids"])
    assert (span["kind"], span["sampled"], span["copy"]) == ("content", [0, 3], [at, at])
    assert trace["status"] == "not_trainable"
    assert trace["metadata"]["trace"]["not_trainable_reasons"] == ["content_drift"]
    assert (stats["trainable"], stats["not_trainable_reasons"]) == (False, ["content_drift"])
    assert stats["drift_tokens_by_kind"] == {"content": 3}


def test_drift_nobody_could_classify_is_not_trainable(store_root):
    (trace,), _, stats = run(store_root, tool_session()[1], decode=None)
    assert [s["kind"] for s in trace["metadata"]["trace"]["drift"]] == ["unknown"]
    assert trace["status"] == "not_trainable" and stats["not_trainable_reasons"] == ["unclassified_drift"]


def test_content_drift_in_one_chain_leaves_the_other_trainable(store_root):
    _, rows = dropped_thoughts()
    clean = Conversation([11]).say("user", [21])
    rows.append(clean.ask([33]))
    traces, _, _ = run(store_root, rows)
    assert [t["status"] for t in traces] == ["not_trainable", "ok"]


def test_a_break_records_where_the_prompts_part_and_both_sides(store_root):
    chat, rows = tool_session()
    chat.messages[3] = chat.spoken[3] = ("tool", [0])  # the harness clears an old tool result
    chat.say("user", [23])
    rows.append(chat.ask([36]))
    traces = run(store_root, rows)[0]
    point = traces[1]["metadata"]["trace"]["break"]
    tip, prompt = rows[2]["prompt_token_ids"], rows[3]["prompt_token_ids"]
    at = point["position"]
    assert tip[:at] == prompt[:at] and tip[at] != prompt[at]
    assert (point["before"], point["was"][:2], point["now"][:2]) == (tip[max(0, at - 24):at], [40, 41], [0, EOT])
    assert point["completion_id"] == traces[0]["completion_ids"][-1]
    assert traces[0]["metadata"]["trace"]["break"] is None



def test_dropped_ids_are_content_drift_even_without_decode(store_root):
    (trace,), _, stats = run(store_root, dropped_thoughts()[1], decode=None)
    assert [s["kind"] for s in trace["metadata"]["trace"]["drift"]] == ["content"]
    assert stats["not_trainable_reasons"] == ["content_drift"]
