"""ATIF export: one v1.4 document per session, steps from the traces' completions, token fields kept."""

from __future__ import annotations

import json

import pytest
from tracetap.builders.exports import export
from tracetap.store import StoreWriter, write_session_table

SYSTEM = {"role": "system", "content": "You fix bugs."}
USER = {"role": "user", "content": [{"type": "text", "text": "fix "}, {"type": "text", "text": "calc"}]}
CALL_1 = {"id": "call-1", "type": "function",
          "function": {"name": "bash", "arguments": '{"cmd": "cat calc.py"}'}}
CALL_2 = {"id": "call-2", "type": "function", "function": {"name": "edit", "arguments": "not json"}}


def turn(messages, content, sampled, tools=(), reasoning=None, logprobs=True, finish="tool_calls") -> dict:
    message = {"role": "assistant", "content": content, "reasoning": reasoning}
    return {"status": "ok", "served_model": "tiny", "requested_model": "gpt-x", "api": "openai_chat",
            "chat_request_json": json.dumps({"messages": messages}),
            "chat_response_json": json.dumps({"choices": [{"message": message}]}),
            "prompt_token_ids": list(range(10 * len(messages))), "completion_token_ids": sampled,
            "logprobs": [-0.5] * len(sampled) if logprobs else None, "finish_reason": finish,
            "prompt_tokens": 10 * len(messages), "completion_tokens": len(sampled),
            "tool_calls": [{"id": c["id"], **c["function"]} for c in tools]}


HISTORY_1 = [SYSTEM, USER]
HISTORY_2 = HISTORY_1 + [{"role": "assistant", "content": "Let me look", "tool_calls": [CALL_1]},
                         {"role": "tool", "tool_call_id": "call-1", "content": "def sub(a, b): return a + b"}]
HISTORY_3 = HISTORY_2 + [{"role": "assistant", "content": "Fixed", "tool_calls": [CALL_2]},
                         {"role": "tool", "tool_call_id": "call-2", "content": "ok"},
                         {"role": "user", "content": "thanks?"}]
TURNS = [turn(HISTORY_1, "Let me look", [11, 12, 2], [CALL_1], reasoning="look first"),
         turn(HISTORY_2, "Fixed", [13, 2], [CALL_2]),
         turn(HISTORY_3, "Done.", [14, 15, 2], logprobs=False, finish="stop"),
         turn([{"role": "user", "content": "sub task"}], "sub done", [16, 2], finish="stop")]


@pytest.fixture
def document(tmp_path) -> dict:
    root = tmp_path / "store"
    with StoreWriter(root) as writer:
        writer.register_session("a1", "t1", "my-harness")
        for n, row in enumerate(TURNS):
            writer.record_completion({**row, "session_id": "a1", "completion_id": f"a1-{n}"})
    base = {"builder": "prefix_merging", "prompt_token_ids": [1], "response_token_ids": [2], "loss_mask": [1],
            "status": "ok", "segment_index": 0}
    traces = [{**base, "trace_index": 0, "chain_index": 0, "completion_ids": ["a1-0", "a1-1", "a1-2"]},
              {**base, "trace_index": 1, "chain_index": 1, "completion_ids": ["a1-3"]}]
    write_session_table(root, "trajectories", "a1", traces, builder="prefix_merging")
    reward = {"evaluator": "ev", "trace_rewards": [1.0, 0.0]}
    write_session_table(root, "rewards", "a1", [reward], evaluator="ev")
    summary = export(root, "prefix_merging", "atif", tmp_path / "atif", evaluator="ev")
    assert (summary.sessions, summary.written) == (1, 2)
    assert sorted(p.name for p in (tmp_path / "atif").iterdir()) == ["a1.json"]
    return json.loads((tmp_path / "atif" / "a1.json").read_text())


def test_document_follows_the_atif_schema(document):
    assert document["schema_version"] == "ATIF-v1.4" and document["session_id"] == "a1"
    assert document["agent"]["name"] == "my-harness" and isinstance(document["agent"]["version"], str)
    assert document["agent"]["model_name"] == "tiny"
    steps = document["steps"]
    assert [s["step_id"] for s in steps] == list(range(1, len(steps) + 1))
    for step in steps:
        assert step["source"] in ("system", "user", "agent") and isinstance(step["message"], str)
        assert "metrics" not in step or step["source"] == "agent"
        for call in step.get("tool_calls", []):
            assert set(call) == {"tool_call_id", "function_name", "arguments"}
            assert isinstance(call["arguments"], dict)
    assert document["final_metrics"]["total_steps"] == len(steps)
    sampled = sum(len(t["completion_token_ids"]) for t in TURNS)
    assert document["final_metrics"]["total_completion_tokens"] == sampled


def test_steps_replay_the_conversation(document):
    steps = document["steps"]
    assert [(s["source"], s["message"]) for s in steps] == [
        ("system", "You fix bugs."), ("user", "fix calc"), ("agent", "Let me look"), ("agent", "Fixed"),
        ("user", "thanks?"), ("agent", "Done."), ("user", "sub task"), ("agent", "sub done")]
    look, fixed = steps[2], steps[3]
    assert look["reasoning_content"] == "look first"
    assert look["tool_calls"] == [{"tool_call_id": "call-1", "function_name": "bash",
                                   "arguments": {"cmd": "cat calc.py"}}]
    assert look["observation"] == {"results": [{"source_call_id": "call-1",
                                                "content": "def sub(a, b): return a + b"}]}
    assert fixed["tool_calls"][0]["arguments"] == {"raw_arguments": "not json"}
    assert fixed["observation"]["results"][0]["source_call_id"] == "call-2"
    assert [s["extra"]["trace_index"] for s in steps] == [0] * 6 + [1] * 2


def test_agent_steps_carry_token_ids_and_only_aligned_logprobs(document):
    agents = [s for s in document["steps"] if s["source"] == "agent"]
    for step, row in zip(agents, TURNS, strict=True):
        assert step["metrics"]["completion_token_ids"] == row["completion_token_ids"]
        assert step["metrics"]["prompt_token_ids"] == row["prompt_token_ids"]
        assert step["metrics"]["completion_tokens"] == len(row["completion_token_ids"])
        assert step["metrics"].get("logprobs") == row["logprobs"]
        assert step["model_name"] == "tiny" and step["timestamp"]
    assert [s["extra"]["completion_id"] for s in agents] == ["a1-0", "a1-1", "a1-2", "a1-3"]


def test_trace_rewards_and_provenance_in_the_root_extra(document):
    tracetap = document["extra"]["tracetap"]
    assert (tracetap["task_id"], tracetap["builder"], tracetap["evaluator"]) == ("t1", "prefix_merging", "ev")
    assert [t["reward"] for t in tracetap["traces"]] == [1.0, 0.0]
    assert tracetap["missing_completions"] == []
