"""Merge invariants of prefix_merging (routing in builders/chains.py), checked with hypothesis.

Sessions are generated as agents talking through the toy template: turns that stop, call tools,
get cut at `length` (kept, or dropped by the harness when empty), re-render differently, lack
logprobs, get retried, and several agents interleaved.
"""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from session_shapes import play, turns
from toychat import Conversation, numbered
from tracetap.builders import merge_session


def check_invariants(rows: list[dict], traces: list[dict], stats: dict) -> None:
    by_id = {row["completion_id"]: row for row in rows}
    seen = []
    for index, trace in enumerate(traces):
        assert trace["trace_index"] == index
        response, mask = trace["response_token_ids"], trace["loss_mask"]
        assert len(mask) == len(response)
        expected_mask = np.zeros(len(response), dtype=np.int8)
        for span in json.loads(trace["metadata_json"])["spans"]:
            call = by_id[span["completion_id"]]
            window = slice(span["start"], span["start"] + span["length"])
            assert response[window].tolist() == call["completion_token_ids"]
            expected_mask[window] = 1
            if trace["response_logprobs"] is not None:
                assert np.allclose(trace["response_logprobs"][window], call["logprobs"])
        assert mask.tolist() == expected_mask.tolist()
        assert int(mask.sum()) == sum(len(by_id[c]["completion_token_ids"]) for c in trace["completion_ids"])
        logprobs = trace["response_logprobs"]
        if logprobs is not None:
            assert len(logprobs) == len(response) and not logprobs[mask == 0].any()
            assert all(by_id[c]["logprobs"] is not None for c in trace["completion_ids"])
        else:
            assert any(by_id[c]["logprobs"] is None for c in trace["completion_ids"])
        seen += trace["completion_ids"]
    assert len(seen) == len(set(seen))
    left_out = stats["retries"] + stats["empty_truncations"]
    assert stats["completions_preserved"] == len(seen) == len(rows) - left_out


@settings(max_examples=150, deadline=None)
@given(st.lists(turns(), min_size=1, max_size=8), st.booleans())
def test_linear_agent_merges_into_one_trace_equal_to_its_history(steps, thinking):
    chat = Conversation([12, 13], thinking=thinking).say("user", [20])
    rows = []
    for step in steps:
        rows += play(chat, step)
    last = rows[-1]
    rows = numbered(rows)
    traces, stats = merge_session(rows, eot_id=2)
    check_invariants(rows, traces, stats)
    assert stats["segments"] == 1 and stats["break_reasons"] == {}
    kept = [step for step in steps if step["finish"] != "length" or step["content"] or step["keep_empty"]]
    if thinking and kept and kept[-1] is steps[-1]:  # the stream ends with the last call's sampled ids
        (trace,) = traces
        stream = trace["prompt_token_ids"].tolist() + trace["response_token_ids"].tolist()
        assert stream == chat.expected_stream(last)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), turns()), min_size=1, max_size=12), st.booleans())
def test_interleaved_agents_keep_every_invariant(schedule, same_system):
    agents = [Conversation([12] if same_system else [12, 13 + k]).say("user", [20 + k]) for k in range(3)]
    rows, owner = [], []
    for agent, step in schedule:
        played = play(agents[agent], step)
        if step["rewrite"]:  # e.g. an old tool result cleared: the history no longer extends the tip
            edited = ("user", [0] * (len(rows) % 3 + 1))
            agents[agent].messages[1] = agents[agent].spoken[1] = edited
        rows += played
        owner += [agent] * len(played)
    rows = numbered(rows)
    traces, stats = merge_session(rows)
    check_invariants(rows, traces, stats)
    agent_of = {row["completion_id"]: agent for row, agent in zip(rows, owner, strict=True)}
    chains: dict[int, set[int]] = {}
    for trace in traces:  # a trace never mixes agents; a chain only when they share a system prompt
        assert len({agent_of[c] for c in trace["completion_ids"]}) == 1
        chains.setdefault(trace["chain_index"], set()).update(agent_of[c] for c in trace["completion_ids"])
    assert same_system or all(len(agents) == 1 for agents in chains.values())
