"""The view model against a real store: turns from completions, tokens from trajectories, decoded for real."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tracetap.report.session_view import (
    INTER,
    PROMPT,
    TRAIN,
    SessionNotFound,
    heat_level,
    load_session_view,
    span_starts,
    visible_text,
)
from tracetap.store import InvalidSessionId, StoreWriter
from viewstore import FAILED_ERROR, FINAL, REPLIES, TOOL_RESULTS, USER, ok_row, query


def test_turns_follow_the_recorded_calls_in_seq_order(view, view_store):
    calls = query(view_store, "SELECT * FROM completions WHERE session_id = 'view-1' ORDER BY seq")
    assert [t.seq for t in view.turns] == [c["seq"] for c in calls] == [0, 1, 2, 3, 4]
    for turn, call in zip(view.turns, calls, strict=True):
        assert (turn.completion_id, turn.status, turn.http_status, turn.finish_reason) == \
            (call["completion_id"], call["status"], call["http_status"], call["finish_reason"])
        assert (turn.prompt_tokens, turn.completion_tokens, turn.upstream_ms, turn.gateway_ms) == \
            (call["prompt_tokens"], call["completion_tokens"], call["upstream_ms"], call["gateway_ms"])
        assert (turn.api, turn.requested_model, turn.served_model) == \
            (call["api"], call["requested_model"], call["served_model"])
        expected = [(c["name"], c["arguments"]) for c in call["tool_calls"] or ()]
        assert [(c.name, c.arguments) for c in turn.tool_calls] == expected
        if call["logprobs"]:
            assert turn.mean_logprob == pytest.approx(sum(call["logprobs"]) / len(call["logprobs"]))


def test_turn_content_inputs_and_failures(view):
    first, second, third, failed, _ = view.turns
    assert first.text == REPLIES[0]["content"] and third.text == FINAL
    assert second.text is None and second.tool_calls[0].name == "write_file"
    assert [(m.role, m.text) for m in first.inputs] == [("system", "You are a careful coding agent."),
                                                        ("user", USER["content"])]
    assert [(m.role, m.text) for m in second.inputs] == [("tool", TOOL_RESULTS[0])]
    assert (failed.status, failed.http_status, failed.error, failed.text) == \
        ("upstream_error", 500, FAILED_ERROR, None)
    assert first.capture_mode == "live" and failed.capture_mode is None


def test_merged_trace_tokens_match_the_stored_trajectory(view, stored_traces, tok):
    assert view.builder == "prefix_merging"
    stored = stored_traces[("view-1", "prefix_merging")]
    assert len(view.traces) == len(stored) == 2
    for trace, row in zip(view.traces, stored, strict=True):
        assert [t.token_id for t in trace.tokens] == row["prompt_token_ids"] + row["response_token_ids"]
        kinds = [PROMPT] * len(row["prompt_token_ids"]) + [TRAIN if m else INTER for m in row["loss_mask"]]
        assert [t.kind for t in trace.tokens] == kinds
        response = trace.tokens[len(row["prompt_token_ids"]):]
        assert [t.logprob for t in response] == pytest.approx(row["response_logprobs"])
        assert all(t.logprob is None for t in trace.tokens[:len(row["prompt_token_ids"])])
        # per-token decoding of this ASCII conversation joins back to the tokenizer's own decoding
        ids = row["prompt_token_ids"] + row["response_token_ids"]
        assert "".join(t.text for t in trace.tokens) == tok.decode(ids)
        assert (trace.break_reason, trace.chain_index, trace.segment_index) == \
            (row["break_reason"], row["chain_index"], row["segment_index"])
    assert [t.break_reason for t in view.traces] == [None, "canonical_prefix_break"]
    assert [t.seqs for t in view.traces] == [[0, 1, 2], [4]]


def test_trainable_tokens_name_the_call_that_sampled_them(view, view_store):
    calls = {c["seq"]: c for c in query(view_store, "SELECT * FROM completions WHERE session_id = 'view-1'")}
    trace = view.traces[0]
    for seq in trace.seqs:
        sampled = [t.token_id for t in trace.tokens if t.kind == TRAIN and t.seq == seq]
        assert sampled == calls[seq]["completion_token_ids"]
    assert all(t.seq is None for t in trace.tokens if t.kind != TRAIN)
    starts = span_starts(trace)
    assert list(starts.values()) == trace.seqs
    assert all(trace.tokens[i].token_id == calls[s]["completion_token_ids"][0] for i, s in starts.items())


@pytest.mark.parametrize(("session", "builder", "shown", "traces"), [
    ("view-1", None, "prefix_merging", 2),
    ("view-1", "per_request", "per_request", 4),  # one per ok call
    ("view-2", None, "per_request", 1),  # no merged traces: falls back
    ("view-2", "prefix_merging", None, 0),  # asked for explicitly: no fallback
    ("view-3", None, None, 0),
])
def test_builder_choice_and_fallback(view_store, decode_token, session, builder, shown, traces):
    view = load_session_view(view_store, session, decode_token, builder)
    assert (view.builder, len(view.traces)) == (shown, traces)


@pytest.mark.parametrize(("session", "error"), [
    ("nope", SessionNotFound), ("../etc", InvalidSessionId), ("a b", InvalidSessionId),
])
def test_unknown_or_invalid_session_is_a_clear_error(view_store, decode_token, session, error):
    with pytest.raises(error, match="session"):
        load_session_view(view_store, session, decode_token)


def test_unknown_builder_is_refused(view_store, decode_token):
    with pytest.raises(ValueError, match="unknown builder"):
        load_session_view(view_store, "view-1", decode_token, "bogus")


def test_text_falls_back_to_the_decoded_completion(tmp_path, tok, decode_token):
    row = ok_row(tok, "bare", [USER], {"content": "Plain answer."}, 1.0)
    row["chat_response_json"] = None  # e.g. a body the gateway could not keep
    with StoreWriter(tmp_path) as writer:
        writer.record_completion(row)
    (turn,) = load_session_view(tmp_path, "bare", decode_token).turns
    assert turn.text == "Plain answer.<|im_end|>"


@pytest.mark.parametrize(("logprob", "level"), [(0.0, 0), (-0.5, 0), (-0.51, 1), (-2.0, 1), (-4.9, 2),
                                                (-9.99, 3), (-10.0, 3), (-10.01, 4), (-50.0, 4)])
def test_heat_levels(logprob, level):
    assert heat_level(logprob) == level


@pytest.mark.parametrize(("text", "shown"), [
    ("plain", "plain"), ("a\nb", "a↵\nb"), ("\t x", "\t x"), ("\x00\r", "\\x00\\x0d"), ("é", "é"),
    ("\u200b", "\\u200b"),
])
def test_visible_text(text, shown):
    assert visible_text(text) == shown


@pytest.mark.parametrize(("requested", "served", "label"), [
    (None, "tiny", "tiny"), ("tiny", "tiny", "tiny"), ("gpt-x", "tiny", "gpt-x -> tiny"),
])
def test_model_label_shows_a_renamed_model(view, requested, served, label):
    turn = replace(view.turns[0], requested_model=requested, served_model=served)
    assert turn.model_label("->") == label


def test_every_call_carries_its_thread(view_store, decode_token):
    turns = load_session_view(view_store, "view-4", decode_token).turns
    assert [(t.chain_index, t.side_call) for t in turns] == [(0, False), (1, True), (0, False)]
    assert [t.thread_label() for t in turns] == ["chain 0", "chain 1 · side call", "chain 0"]


def test_a_break_shows_where_the_prompt_left_the_old_one_decoded(view, view_store, tok):
    calls = query(view_store, "SELECT seq, prompt_token_ids FROM completions "
                              "WHERE session_id = 'view-1' AND status = 'ok' ORDER BY seq")
    old, new = calls[2]["prompt_token_ids"], calls[3]["prompt_token_ids"]
    at = next(i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b)
    assert view.traces[0].break_point is None
    point = view.traces[1].break_point
    assert (point.position, point.seq) == (at, calls[2]["seq"])
    assert point.before == tok.decode(old[at - 24:at]) and point.before.endswith("<|im_start|>user\n")
    assert point.was == tok.decode(old[at:at + 24]) and point.now == tok.decode(new[at:at + 24])
    assert point.now.startswith("Summary so far") and point.was.startswith("The test fails")
