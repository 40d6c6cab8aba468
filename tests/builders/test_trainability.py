"""Session trainability rules, from failed completion rows or the session's failure counters."""

from __future__ import annotations

import json

import pytest
from tracetap.builders.trainability import not_trainable_reasons


def row(seq: int, status: str = "ok", http_status: int | None = 200, **extra) -> dict:
    return {"seq": seq, "status": status, "http_status": http_status, "finish_reason": "stop", **extra}


def session(**failures) -> dict:
    return {"upstream_failures_json": json.dumps(failures)}


def staleness(versions: int) -> dict:
    return {"metadata_json": json.dumps({"max_staleness": versions})}


@pytest.mark.parametrize(("rows", "session_row", "expected"), [
    ([row(0), row(1)], None, []),
    ([row(0), row(1, finish_reason="abort")], None, ["aborted_completion"]),
    ([row(0, policy_version="3"), row(1, policy_version="4")], None, ["mixed_policy_versions"]),
    ([row(0, policy_version="3"), row(1, policy_version=None)], None, []),
    ([row(0), row(1, "upstream_error", 502)], None, ["truncated_by_upstream_failure"]),
    ([row(0), row(1, "timeout", 504)], None, ["truncated_by_upstream_failure"]),
    ([row(0), row(1, "upstream_error", 400)], None, []),  # rejected before generating: turns complete
    ([row(0), row(1, "upstream_error", 502), row(2)], None, []),  # recovered
    ([row(0), row(1, "upstream_error", 502), row(2, "client_error", 400)], None,
     ["truncated_by_upstream_failure"]),  # a harness error after it is no recovery
    ([row(0), row(1, "upstream_error", 502), row(2, "upstream_error", 400)], None, []),  # the last one counts
    # failed rows not at hand: the session's counters decide (last_at = completions when it failed)
    ([row(0)], session(http_502=1, last_at=2, last_kind="http_502"), ["truncated_by_upstream_failure"]),
    ([row(0), row(2)], session(http_502=1, last_at=2, last_kind="http_502"), []),
    ([row(0)], session(http_400=1, last_at=2, last_kind="http_400"), []),
    # kinds mixed and the last one unknown: judged truncated
    ([row(0)], session(http_400=1, timeout=1, last_at=3), ["truncated_by_upstream_failure"]),
    ([row(0)], session(http_400=1, last_at=2), []),
    ([row(0)], {"upstream_failures_json": None}, []),
    # a pause aborted a call the harness retried: left out, not untrainable; a last one truncates
    ([row(0), row(1, "aborted", 503, finish_reason="abort"), row(2)], None, []),
    ([row(0), row(1, "aborted", 503, finish_reason="abort")], None, ["truncated_by_upstream_failure"]),
    # the session's max_staleness (from its metadata): integer versions that far apart are fine
    ([row(0, policy_version="1"), row(1, policy_version="2")], staleness(1), []),
    ([row(0, policy_version="1"), row(1, policy_version="3")], staleness(1), ["mixed_policy_versions"]),
    ([row(0, policy_version="1"), row(1, policy_version="2")], staleness(0), ["mixed_policy_versions"]),
    ([row(0, policy_version="a"), row(1, policy_version="b")], staleness(5), ["mixed_policy_versions"]),
])
def test_not_trainable_reasons(rows, session_row, expected):
    assert not_trainable_reasons(rows, session_row) == expected
