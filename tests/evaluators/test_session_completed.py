"""session_completed: 1.0 only when the last ok call stopped naturally, nothing pending or failing after."""

from __future__ import annotations

import pytest
from tracetap.evaluators.base import EvalInput
from tracetap.evaluators.session_completed import SessionCompleted

TOOL = [{"id": "c1", "name": "bash", "arguments": "{}"}]


def ok(finish: str, tools=None) -> dict:
    return {"status": "ok", "finish_reason": finish, "tool_calls": tools}


def failed(status: str = "upstream_error") -> dict:
    return {"status": status, "finish_reason": None, "tool_calls": None}


def evaluate(calls: list[dict]):
    completions = [{**call, "seq": seq} for seq, call in enumerate(calls)]
    inp = EvalInput("s1", None, None, [], completions[::-1], 1.0, {})  # any order: sorted by seq
    return SessionCompleted().evaluate(inp)


@pytest.mark.parametrize("calls, reward, reason", [
    ([ok("tool_calls", TOOL), ok("stop")], 1.0, "completed"),
    ([failed(), ok("stop")], 1.0, "completed"),
    ([ok("end_turn")], 1.0, "completed"),
    ([], 0.0, "no ok completion"),
    ([failed("timeout")], 0.0, "no ok completion"),
    ([ok("stop"), ok("length")], 0.0, "did not stop naturally"),
    ([ok("tool_calls", TOOL)], 0.0, "did not stop naturally"),
    ([ok("stop", TOOL)], 0.0, "tool calls pending"),
    ([ok("stop"), failed()], 0.0, "failed after"),
    ([ok("stop"), failed("client_error")], 0.0, "failed after"),
    ([ok("abort")], 0.0, "did not stop naturally"),
])
def test_rule(calls, reward, reason):
    result = evaluate(calls)
    assert result.reward == reward
    assert reason in result.details["reason"]
    assert result.trace_rewards is None


def test_details_name_the_deciding_call():
    details = evaluate([ok("tool_calls", TOOL), ok("stop"), failed(), failed()]).details
    assert details["last_ok_seq"] == 1 and details["failed_after"] == 2
