"""Session-level trainability: may a trainer use this session's traces at all?

A session is not trainable when
- a completion ended with `abort` (the engine cut it off, e.g. for a weight update);
- its completions were sampled by policy versions further apart than the session's `max_staleness`
  (default 0: one version only; a rollout task's `max_staleness` reaches the builders through the
  session row's metadata, which the node registers; versions that are not integers are never within
  a staleness of each other);
- its last upstream failure left it truncated: no ok completion came after it. A 4xx is a request
  the upstream rejected before generating anything (a context overflow): the turns before it are
  complete, so it does not count.
A trace is also not trainable when its turns drifted in content (`content_drift`: the next prompt holds
other text than the model sampled, so the trace would teach text the model no longer saw) or drifted
in a way nobody could classify (`unclassified_drift`: no decode function given); see builders/drift.py.
Failed calls are rows of `completions` (status upstream_error, timeout, aborted by a pause, or
disconnected: the client left a stream; the harness retries those, and only a last one with no ok call
after it leaves the session truncated); the session row's `upstream_failures_json` (`{kind: count,
last_at, last_kind}`, where `last_at` is the number of completions recorded when the failure happened)
is used when those rows are not at hand.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

FAILED = ("upstream_error", "timeout", "aborted", "disconnected")
DRIFT_REASONS = {"content": "content_drift", "unknown": "unclassified_drift"}
_HTTP_4XX = re.compile(r"^http_4\d\d$")


def _rejected_before_generation(row: dict) -> bool:
    return row["status"] == "upstream_error" and 400 <= (row.get("http_status") or 0) < 500


def _failure_from_rows(rows: list[dict]) -> tuple[int, bool] | None:
    """(seq, was a 4xx) of the last failed call among `rows`, or None."""
    failures = [row for row in rows if row.get("status") in FAILED]
    if not failures:
        return None
    last = max(failures, key=lambda row: row["seq"])
    return int(last["seq"]), _rejected_before_generation(last)


def _failure_from_session(session: dict | None) -> tuple[int, bool] | None:
    """The same from the session row's failure counters (seq = last_at - 1)."""
    try:
        info = json.loads((session or {}).get("upstream_failures_json") or "{}")
    except ValueError:
        return None
    if not isinstance(info, dict) or not isinstance(info.get("last_at"), int):
        return None
    kind = info.get("last_kind")
    if kind is None:  # kinds mixed and the last one unknown: judge it a non-4xx, conservatively
        counted = [k for k in info if k not in ("last_at", "last_kind")]
        kind = counted[0] if len(counted) == 1 else "unknown"
    return info["last_at"] - 1, bool(_HTTP_4XX.match(str(kind)))


def truncated_by_failure(rows: list[dict], session: dict | None = None) -> bool:
    """True when the session's last upstream failure (not a 4xx) had no ok completion after it."""
    failure = _failure_from_rows(rows) or _failure_from_session(session)
    if failure is None:
        return False
    seq, rejected = failure
    return not rejected and not any(row.get("status") == "ok" and row["seq"] > seq for row in rows)


def not_trainable_reasons(rows: list[dict], session: dict | None = None) -> list[str]:
    """Why a session's traces must not be trained on; empty when they may be."""
    reasons = []
    if any(row.get("status") == "ok" and row.get("finish_reason") == "abort" for row in rows):
        reasons.append("aborted_completion")
    versions = {row["policy_version"] for row in rows
                if row.get("status") == "ok" and row.get("policy_version") is not None}
    if not within_staleness(versions, max_staleness(session)):
        reasons.append("mixed_policy_versions")
    if truncated_by_failure(rows, session):
        reasons.append("truncated_by_upstream_failure")
    return reasons


def max_staleness(session: dict | None) -> int:
    """How many policy versions apart a session's calls may be: its metadata's `max_staleness`, else 0."""
    try:
        value = json.loads((session or {}).get("metadata_json") or "{}").get("max_staleness", 0)
    except (ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def within_staleness(versions: set[str], staleness: int) -> bool:
    """One version, or integer versions at most `staleness` apart."""
    if len(versions) <= 1:
        return True
    if not all(version.lstrip("-").isdigit() for version in versions):
        return False
    numbers = [int(version) for version in versions]
    return max(numbers) - min(numbers) <= staleness


def drift_reasons(kinds: Iterable[str]) -> list[str]:
    """Why drift of these kinds (builders/drift.py) makes a trace untrainable; empty when it does not."""
    present = set(kinds)
    return [reason for kind, reason in DRIFT_REASONS.items() if kind in present]
