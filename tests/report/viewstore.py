"""A real store for the viewer tests: a tool-using conversation rendered with the engine's tokenizer.

- view-1: three turns (two tool calls, then a final answer whose text holds HTML), a failed call,
  then a call whose history was rewritten (same system prompt, summarized conversation): the
  prefix_merging builder gives one chain with two segments, the second with break
  `canonical_prefix_break`.
- view-2: one turn; only per_request traces are built for it.
- view-3: one failed call; no traces.
- view-4: two tool-using turns and, between them, a title call offering no tools (a side call, its
  own chain).
"""

from __future__ import annotations

import json
from pathlib import Path

from tracetap.builders import build
from tracetap.store import StoreWriter, connect

from tracetap.agent import TOOLS

SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
USER = {"role": "user", "content": "The test fails. Fix calc.py."}
FINAL = "Fixed: <b>add</b> & mul now return a+b / a*b."
LOGPROB_CYCLE = (-0.05, -1.0, -3.0, -7.0, -12.5)  # one per heat level
FAILED_ERROR = "upstream said <script>alert(1)</script>"


def _call(name: str, arguments: dict, n: int) -> dict:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": f"call-{n}", "type": "function", "function": function}


REPLIES = [
    {"content": "Let me run the tests.", "tool_calls": [_call("run_shell", {"command": "pytest -q"}, 0)]},
    {"content": None, "tool_calls": [_call("write_file", {"path": "calc.py", "content": "def add(a, b):\n"
                                                           "    return a + b\n"}, 1)]},
    {"content": FINAL},
]
TOOL_RESULTS = ["1 failed: test_add", "wrote calc.py"]


def ok_row(tok, sid: str, messages: list[dict], reply: dict, upstream_ms: float,
           tools: list[dict] | None = TOOLS) -> dict:
    """The completions row the gateway would record for `reply` following `messages`."""
    prompt = tok.encode(tok.render(messages, tools))
    sampled = tok.encode(tok.assistant_turn(messages, reply, tools))
    calls = [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for c in reply.get("tool_calls") or ()]
    finish = "tool_calls" if calls else "stop"
    message = {"role": "assistant", **reply}
    return {
        "session_id": sid, "task_id": "fix-calc", "api": "openai_chat", "path": "/v1/chat/completions",
        "stream": False, "requested_model": "gpt-x", "served_model": "tiny-qwen3", "status": "ok",
        "http_status": 200, "chat_request_json": json.dumps({"model": "tiny-qwen3", "messages": messages,
                                                             **({"tools": tools} if tools else {})}),
        "chat_response_json": json.dumps({"choices": [{"index": 0, "message": message,
                                                       "finish_reason": finish}]}),
        "prompt_token_ids": prompt, "completion_token_ids": sampled,
        "logprobs": [LOGPROB_CYCLE[i % len(LOGPROB_CYCLE)] for i in range(len(sampled))],
        "finish_reason": finish, "prompt_tokens": len(prompt), "completion_tokens": len(sampled),
        "tool_calls": calls, "upstream_ms": upstream_ms, "gateway_ms": upstream_ms + 1.5,
        "metadata_json": json.dumps({"capture_mode": "live"}),
    }


def failed_row(sid: str) -> dict:
    return {"session_id": sid, "task_id": "fix-calc", "api": "openai_chat", "status": "upstream_error",
            "http_status": 500, "error": FAILED_ERROR, "served_model": "tiny-qwen3",
            "upstream_ms": 3.0, "gateway_ms": 4.0}


def conversation_rows(tok, sid: str) -> list[dict]:
    """view-1's calls, in order."""
    messages, rows = [SYSTEM, USER], []
    for n, reply in enumerate(REPLIES):
        rows.append(ok_row(tok, sid, list(messages), reply, upstream_ms=100.0 + n))
        messages.append({"role": "assistant", **reply})
        if n < len(TOOL_RESULTS):
            messages.append({"role": "tool", "tool_call_id": f"call-{n}", "content": TOOL_RESULTS[n]})
    rows.append(failed_row(sid))
    summary = [SYSTEM, {"role": "user", "content": "Summary so far: calc.py fixed. Confirm."}]
    rows.append(ok_row(tok, sid, summary, {"content": "Confirmed."}, upstream_ms=50.0))
    return rows


def side_call_rows(tok, sid: str) -> list[dict]:
    """view-4's calls: turn, title call (no tools), turn."""
    first = ok_row(tok, sid, [SYSTEM, USER], REPLIES[0], 10.0)
    title = ok_row(tok, sid, [{"role": "user", "content": "A title for: " + USER["content"]}],
                   {"content": "Fixing calc.py"}, 5.0, tools=None)
    history = [SYSTEM, USER, {"role": "assistant", **REPLIES[0]},
               {"role": "tool", "tool_call_id": "call-0", "content": TOOL_RESULTS[0]}]
    return [first, title, ok_row(tok, sid, history, {"content": FINAL}, 11.0)]


def make_view_store(root: Path, tok) -> Path:
    with StoreWriter(root) as writer:
        for row in [*conversation_rows(tok, "view-1"), *side_call_rows(tok, "view-4")]:
            writer.record_completion(row)
        writer.record_completion(ok_row(tok, "view-2", [SYSTEM, USER], {"content": "On it."}, 20.0))
        writer.record_completion(failed_row("view-3"))
    build(root, "prefix_merging", session_ids=["view-1", "view-4"], decode=tok.decode)
    build(root, "per_request", session_ids=["view-1", "view-2"])
    return root


def query(root: Path, sql: str, *params) -> list[dict]:
    """Rows of a query over the store's DuckDB views, as dicts."""
    return connect(root).sql(sql, params=list(params)).to_arrow_table().to_pylist()
