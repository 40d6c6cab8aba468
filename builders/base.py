"""What both builders share: completions as `Call`s, trace rows in the `trajectories` shape.

A builder is a pure function `(completions, eot_id=None, session=None, decode=None) -> (traces, stats)` over one
session: `completions` are that session's rows of the `completions` table as stored (any status,
any order; seq and completion_id set; token lists as lists or numpy arrays), `session` its
`sessions` row when known. Traces come back as `trajectories` rows (token columns as numpy arrays,
`metadata_json` holding the stats and where each call's sampled ids sit); stats as a dict.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tracetap.builders.tokens import ids
from tracetap.builders.trainability import not_trainable_reasons

Builder = Callable[..., tuple[list[dict], dict]]


@dataclass(frozen=True)
class Call:
    """One `ok` completion with token ids: the unit the builders route and merge."""

    completion_id: str
    seq: int
    prompt: np.ndarray
    sampled: np.ndarray
    logprobs: np.ndarray | None  # aligned with `sampled`, else None
    finish_reason: str | None
    empty_truncation: bool  # cut at `length` with no text or tool call for the harness to keep
    policy_version: str | None = None  # the weights that sampled it, when known


def _aligned_logprobs(row: dict, sampled: np.ndarray) -> np.ndarray | None:
    logprobs = row.get("logprobs")
    if logprobs is None or len(logprobs) != len(sampled):
        return None
    return np.asarray(logprobs, dtype=np.float32)


def _visible(row: dict, sampled: np.ndarray) -> bool:
    """Did the harness see any content or tool call? (Decides whether it may drop the turn.)"""
    if row.get("tool_calls") is not None and len(row["tool_calls"]):
        return True
    try:
        message = json.loads(row.get("chat_response_json") or "null")["choices"][0]["message"]
        return bool(message.get("content")) or bool(message.get("tool_calls"))
    except (TypeError, KeyError, IndexError, ValueError, AttributeError):  # no usable response body
        return len(sampled) > 0


def to_call(row: dict) -> Call | None:
    """The row as a Call, or None when it lacks prompt or sampled ids (it cannot be trained on)."""
    if row.get("prompt_token_ids") is None or row.get("completion_token_ids") is None:
        return None
    sampled = ids(row["completion_token_ids"])
    return Call(
        completion_id=row["completion_id"], seq=int(row["seq"]), prompt=ids(row["prompt_token_ids"]),
        sampled=sampled, logprobs=_aligned_logprobs(row, sampled),
        finish_reason=row.get("finish_reason"),
        empty_truncation=row.get("finish_reason") == "length" and not _visible(row, sampled),
        policy_version=row.get("policy_version"),
    )


@dataclass
class SessionInput:
    """One session's completions split the way builders need them."""

    rows: list[dict]  # every completion row, in seq order
    calls: list[Call]  # ok rows with token ids
    unusable: list[dict]  # ok rows without token ids
    reasons: list[str]  # why the session is not trainable (empty: trainable)

    @property
    def status(self) -> str:
        return "not_trainable" if self.reasons else "ok"


def prepare(completions: list[dict], session: dict | None = None) -> SessionInput:
    """Sort by seq, keep ok rows (never `degraded` ones), split off those without ids, judge trainability."""
    rows = sorted(completions, key=lambda row: row["seq"])
    calls, unusable = [], []
    for row in rows:
        if row.get("status") == "ok":
            call = to_call(row)
            if call is None:
                unusable.append(row)
            else:
                calls.append(call)
    return SessionInput(rows, calls, unusable, not_trainable_reasons(rows, session))


def session_fields(rows: list[dict]) -> dict:
    """session_id and task_id of a session's traces (task id: first non-empty)."""
    task_ids = [row["task_id"] for row in rows if row.get("task_id")]
    return {"session_id": rows[0]["session_id"] if rows else None,
            "task_id": task_ids[0] if task_ids else None}


def trace_row(builder: str, prompt: np.ndarray, parts: list[tuple[np.ndarray, Call | None]],
              status: str, metadata: dict, **fields) -> dict:
    """A `trajectories` row from a prompt and response parts.

    Each part is `(tokens, call)`: `call` set means the tokens are that call's sampled ids (mask 1,
    its logprobs); None means interstitial context (mask 0, logprob 0.0). Logprobs are null for the
    whole trace when any sampled part lacks aligned ones. `metadata["spans"]` records where each
    call's sampled ids sit in the response and which policy version sampled them; `policy_versions`
    lists the versions in the order they appear.
    """
    chunks, masks, logprobs, spans = [], [], [], []
    aligned, offset = True, 0
    for tokens, call in parts:
        chunks.append(tokens)
        masks.append(np.full(len(tokens), 1 if call else 0, dtype=np.int8))
        if call is not None:
            spans.append({"completion_id": call.completion_id, "start": offset, "length": len(tokens),
                          "policy_version": call.policy_version})
            aligned = aligned and call.logprobs is not None
        logprobs.append(call.logprobs if call is not None and call.logprobs is not None
                        else np.zeros(len(tokens), dtype=np.float32))
        offset += len(tokens)
    return {
        **fields,
        "builder": builder,
        "prompt_token_ids": prompt,
        "response_token_ids": _concat(chunks, np.int32),
        "loss_mask": _concat(masks, np.int8),
        "response_logprobs": _concat(logprobs, np.float32) if aligned else None,
        "status": status,
        "reward": None,
        "metadata_json": json.dumps({**metadata, "spans": spans, "policy_versions": list(dict.fromkeys(
            span["policy_version"] for span in spans if span["policy_version"] is not None))}),
    }


def error_trace(builder: str, row: dict, error: str, metadata: dict, **fields) -> dict:
    """A trace standing for an ok completion that cannot be trained on (kept, never dropped)."""
    empty = np.zeros(0, dtype=np.int32)
    return trace_row(builder, empty, [], "error", {**metadata, "error": error}, **fields,
                     completion_ids=[row["completion_id"]], finish_reason=row.get("finish_reason"))


def base_stats(builder: str, data: SessionInput) -> dict:
    """The stats every builder reports for a session."""
    return {
        "builder": builder,
        "completions": len(data.rows),
        "completions_ok": len(data.calls) + len(data.unusable),
        "completions_without_ids": len(data.unusable),
        "completions_degraded": sum(row.get("status") == "degraded" for row in data.rows),
        "completions_aborted": sum(row.get("status") == "aborted" for row in data.rows),  # by a pause: left out
        "trainable": not data.reasons,
        "not_trainable_reasons": data.reasons,
    }


def _concat(chunks: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(chunks).astype(dtype, copy=False) if chunks else np.zeros(0, dtype=dtype)
