"""`session_completed`: did the agent finish on its own?

Rule (reward 1.0, else 0.0): the session's last `ok` completion stopped naturally (finish reason
`stop`, or `end_turn`/`stop_sequence` from non-normalized upstreams), asked for no tool calls (so no
tool result is pending), and no call after it failed (an upstream error, timeout or client error
after the final answer means the run did not end cleanly). A session with no ok completion scores 0.
It needs no workspace.
"""

from __future__ import annotations

from tracetap.evaluators.base import EvalInput, EvalResult, Evaluator

NATURAL_STOPS = ("stop", "end_turn", "stop_sequence")


def _verdict(completions: list[dict]) -> tuple[bool, dict]:
    ok = [c for c in completions if c.get("status") == "ok"]
    if not ok:
        return False, {"reason": "no ok completion", "completions": len(completions)}
    last = ok[-1]
    failed_after = [c for c in completions if c["seq"] > last["seq"] and c.get("status") != "ok"]
    tool_calls = last.get("tool_calls") or []
    details = {
        "last_ok_seq": last["seq"],
        "finish_reason": last.get("finish_reason"),
        "pending_tool_calls": len(tool_calls),
        "failed_after": len(failed_after),
    }
    if last.get("finish_reason") not in NATURAL_STOPS:
        return False, {**details, "reason": "last ok completion did not stop naturally"}
    if tool_calls:
        return False, {**details, "reason": "last ok completion left tool calls pending"}
    if failed_after:
        return False, {**details, "reason": "a call failed after the last ok completion"}
    return True, {**details, "reason": "completed"}


class SessionCompleted(Evaluator):
    """1.0 when the session ended with a natural stop and nothing failed after it, else 0.0."""

    name = "session_completed"

    def evaluate(self, inp: EvalInput) -> EvalResult:
        completions = sorted(inp.completions, key=lambda c: c["seq"])
        done, details = _verdict(completions)
        return EvalResult(reward=1.0 if done else 0.0, details=details)
