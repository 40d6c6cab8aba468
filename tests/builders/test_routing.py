"""prefix_merging routed on capture's prompt references equals the build that compares whole prompts.

Sessions of random shapes (linear, interleaved agents sharing a system prompt or not, retries,
truncations, re-rendered turns, rewritten history) are recorded by the real store writer, which
stores each prompt as a reference to an earlier call plus a suffix. The same rows read back in that
compact form (what the runner reads) and with whole prompts (no reference: every call is routed by
comparison) must give the same traces, breaks, drift and stats.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from session_shapes import play, turns
from toychat import Conversation
from tracestore import write_store
from tracetap.builders import merge_session
from tracetap.builders.base import prepare
from tracetap.builders.chains import Router
from tracetap.builders.runner import READ_COLUMNS, table_rows
from tracetap.store import StoreReader

SYSTEM = list(range(100, 180))  # longer than capture's shortest reference (64 tokens)
FULL_COLUMNS = [name for name in READ_COLUMNS if not name.startswith("prompt_")] + ["prompt_token_ids"]


def recorded(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(rows as the runner reads them, with compact prompts; the same rows with whole prompts)."""
    with tempfile.TemporaryDirectory() as tmp:
        reader = StoreReader(write_store(Path(tmp) / "store", rows))
        sid = rows[0]["session_id"]
        return table_rows(reader.completions(sid, READ_COLUMNS)), table_rows(reader.completions(sid, FULL_COLUMNS))


def plain(traces: list[dict]) -> list[dict]:
    return [{key: value.tolist() if isinstance(value, np.ndarray) else value for key, value in trace.items()}
            for trace in traces]


def assert_routed_equals_compared(rows: list[dict]) -> None:
    compact, full = recorded(rows)
    routed_traces, routed_stats = merge_session(compact)
    compared_traces, compared_stats = merge_session(full)
    assert plain(routed_traces) == plain(compared_traces)
    assert routed_stats == compared_stats


@settings(max_examples=40, deadline=None)
@given(st.lists(turns(), min_size=1, max_size=8), st.booleans())
def test_linear_agent(steps, thinking):
    chat = Conversation(SYSTEM, thinking=thinking).say("user", [20])
    rows = []
    for step in steps:
        rows += play(chat, step)
    assert_routed_equals_compared(rows)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), turns()), min_size=1, max_size=12), st.booleans(), st.booleans())
def test_interleaved_agents(schedule, same_system, truncate):
    agents = [Conversation(SYSTEM if same_system else [*SYSTEM, 13 + k]).say("user", [20 + k]) for k in range(3)]
    rows: list[dict] = []
    for agent, step in schedule:
        played = play(agents[agent], step)
        if step["rewrite"]:  # an old message edited: the history no longer extends the tip
            edited = ("user", [0] * (len(rows) % 3 + 1))
            agents[agent].messages[1] = agents[agent].spoken[1] = edited
        if truncate and len(agents[agent].messages) > 4:  # compaction: older turns dropped
            del agents[agent].messages[2:4], agents[agent].spoken[2:4]
        rows += played
    assert_routed_equals_compared(rows)


def test_a_linear_session_is_routed_without_materializing_a_prompt():
    chat = Conversation(SYSTEM).say("user", [20])
    rows = []
    for turn in range(6):
        rows.append(chat.ask([30 + turn, 31], "tool_calls"))
        chat.say("tool", [40 + turn])
    compact, _ = recorded(rows)
    calls = prepare(compact).calls
    (segment,) = Router(calls, eot=2).route()
    assert [turn.call.seq for turn in segment.turns] == [call.seq for call in calls]
    assert [call.seq for call in calls if "prompt" in call.__dict__] == [calls[0].seq]  # the trace's prompt


def test_identical_agents_are_compared_where_a_reference_names_one_of_two_equal_tips():
    agents = [Conversation(SYSTEM).say("user", [20]) for _ in range(2)]
    rows = []
    for turn in range(3):
        for agent in agents:  # both agents send and sample the very same ids
            rows.append(agent.ask([30 + turn, 31], "tool_calls"))
            agent.say("tool", [40 + turn])
    assert_routed_equals_compared(rows)
