"""A small, fully known store for evaluator, export, query and CLI tests.

Completions and sessions are written by the real StoreWriter; trajectories and rewards by the
store's `write_session_table`, in the schema, with chains and breaks chosen here, so tests can derive
every expected number from the constants below.

- s1 (task t1, harness h1, group g1): three identical `bash ls` tool-call turns, then a natural stop.
- s2 (task t1, harness h2): a tool call without logprobs, a `length` stop, then a 400 context overflow.
- s3 (task t2, harness h1): two tool calls in one turn, then an upstream timeout.
"""

from __future__ import annotations

import json
from pathlib import Path

from store_forms import as_form
from tracetap.store import StoreWriter, write_session_table

OVERFLOW = "This model's maximum context length is 4096 tokens. However, your prompt contains 4097."
BASH_LS = {"id": "call-ls", "name": "bash", "arguments": '{"cmd": "ls"}'}


def ok(prompt_len: int, sampled: list[int], finish: str, tools=(), logprobs=True, upstream=10.0, extra=0.0):
    return {"status": "ok", "http_status": 200, "api": "openai_chat", "served_model": "tiny",
            "prompt_token_ids": list(range(100, 100 + prompt_len)), "completion_token_ids": sampled,
            "logprobs": [-0.25] * len(sampled) if logprobs else None, "finish_reason": finish,
            "prompt_tokens": prompt_len, "completion_tokens": len(sampled), "tool_calls": list(tools),
            "upstream_ms": upstream, "gateway_ms": upstream + extra,
            "chat_request_json": json.dumps({"messages": [{"role": "user", "content": "go"}]}),
            "chat_response_json": json.dumps({"choices": [{"message": {"content": "done"}}]})}


def failed(status: str, http_status: int, error: str) -> dict:
    return {"status": status, "http_status": http_status, "error": error, "served_model": "tiny",
            "api": "openai_chat", "upstream_ms": 5.0, "gateway_ms": 6.0}


SESSIONS = {
    "s1": {"task_id": "t1", "harness": "h1", "metadata": {"group_id": "g1"}},
    "s2": {"task_id": "t1", "harness": "h2", "metadata": {}},
    "s3": {"task_id": "t2", "harness": "h1", "metadata": {}},
}
COMPLETIONS = {
    "s1": [ok(10, [20, 21, 2], "tool_calls", [BASH_LS], upstream=10, extra=2),
           ok(16, [22, 2], "tool_calls", [BASH_LS], upstream=20, extra=3),
           ok(22, [23, 2], "tool_calls", [BASH_LS], upstream=30, extra=4),
           ok(28, [24, 25, 26, 2], "stop", upstream=40, extra=5)],
    "s2": [ok(8, [30, 2], "tool_calls", [{"id": "c1", "name": "read_file", "arguments": '{"path": "a.py"}'}],
              logprobs=False),
           ok(14, [31, 32, 33], "length"),
           failed("upstream_error", 400, OVERFLOW)],
    "s3": [ok(5, [40, 2], "tool_calls", [{"id": "c1", "name": "bash", "arguments": '{"cmd": "pytest"}'},
                                         {"id": "c2", "name": "read_file", "arguments": '{"path": "b.py"}'}]),
           failed("timeout", 504, "upstream timed out")],
}


def trace(sid: str, index: int, chain: int, segment: int, cids: list[str], prompt: int, mask: list[int],
          status: str = "ok", break_reason: str | None = None, finish: str = "stop") -> dict:
    response = list(range(500, 500 + len(mask)))
    return {"session_id": sid, "task_id": SESSIONS[sid]["task_id"], "builder": "prefix_merging",
            "trace_index": index, "chain_index": chain, "segment_index": segment, "completion_ids": cids,
            "prompt_token_ids": list(range(100, 100 + prompt)), "response_token_ids": response,
            "loss_mask": mask, "response_logprobs": [-0.5 if m else 0.0 for m in mask],
            "finish_reason": finish, "break_reason": break_reason, "status": status,
            "metadata_json": json.dumps({"trace": {"drift_tokens": index, "retried_completion_ids": []}})}


# s1: one merged trace: prompt 10, then 4 turns (3 + 2 + 2 + 4 sampled) with interstitials between
S1_MASK = [1, 1, 1] + [0] * 3 + [1, 1] + [0] * 4 + [1, 1] + [0] * 4 + [1, 1, 1, 1]
TRAJECTORIES = {
    "s1": [trace("s1", 0, 0, 0, ["s1-0", "s1-1", "s1-2", "s1-3"], 10, S1_MASK)],
    "s2": [trace("s2", 0, 0, 0, ["s2-0"], 8, [1, 1], finish="tool_calls"),
           trace("s2", 1, 0, 1, ["s2-1"], 14, [1, 1, 1], break_reason="canonical_prefix_break",
                 finish="length")],
    "s3": [trace("s3", 0, 0, 0, ["s3-0"], 5, [1, 1], status="not_trainable", finish="tool_calls")],
}
REWARDS = {
    "s1": {"reward": 1.0, "details": {}},
    "s2": {"reward": 0.0, "details": {}},
    "s3": {"reward": None, "details": {"error": "EvaluatorError: boom"}},
}


def make_store(root: Path, *, trajectories: bool = True, rewards: bool = True) -> Path:
    """Write the sample store at `root` (completion ids are `<sid>-<n>`)."""
    with StoreWriter(root) as writer:
        for sid, spec in SESSIONS.items():
            writer.register_session(sid, spec["task_id"], spec["harness"], spec["metadata"])
            for n, row in enumerate(COMPLETIONS[sid]):
                writer.record_completion({**row, "session_id": sid, "task_id": spec["task_id"],
                                          "completion_id": f"{sid}-{n}"})
    for sid, traces in TRAJECTORIES.items() if trajectories else ():
        write_session_table(root, "trajectories", sid, traces, builder="prefix_merging")
    for sid, reward in REWARDS.items() if rewards else ():
        row = {"evaluator": "session_completed", "reward": reward["reward"],
               "details_json": json.dumps(reward["details"])}
        write_session_table(root, "rewards", sid, [row], evaluator="session_completed")
    return as_form(root)  # the store-form runs migrate these tables too
