"""What both builders share: completions as `Call`s, trace rows in the `trajectories` shape.

A builder is a pure function `(completions, eot_id=None, session=None, decode=None) -> (traces, stats)` over one
session: `completions` are that session's rows of the `completions` table (any status, any order;
seq and completion_id set; token lists as lists or numpy arrays; prompts as `prompt_token_ids` or in
the compact columns `prompt_ref_seq`, `prompt_ref_len`, `prompt_suffix_ids`), `session` its
`sessions` row when known. Traces come back as `trajectories` rows (token columns as numpy arrays,
`metadata_json` holding the stats and where each call's sampled ids sit); stats as a dict.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from tracetap.builders.tokens import ids
from tracetap.builders.trainability import not_trainable_reasons
from tracetap.store import Prompts, Stored

Builder = Callable[..., tuple[list[dict], dict]]


@dataclass(frozen=True)
class Call:
    """One `ok` completion with token ids: the unit the builders route and merge.

    Its prompt is kept as stored (a reference into an earlier call plus a suffix, see store.Prompts) and
    materialized whole only when a builder reads `prompt`: routing a turn that extends its chain's tip
    needs only the new tail.
    """

    completion_id: str
    seq: int
    sampled: np.ndarray
    logprobs: np.ndarray | None  # aligned with `sampled`, else None
    finish_reason: str | None
    empty_truncation: bool  # cut at `length` with no text or tool call for the harness to keep
    prompts: Prompts  # the session's prompts, this call's among them
    policy_version: str | None = None  # the weights that sampled it, when known
    tokenization: str = "upstream"  # who tokenized its prompt: the upstream, or the gateway (token-in)

    @cached_property
    def prompt(self) -> np.ndarray:
        return self.prompts.prompt(self.seq)

    @property
    def prompt_len(self) -> int:
        return self.prompts.length(self.seq)

    @property
    def stored(self) -> Stored:
        """The prompt as capture stored it: which earlier call it extends, by how many tokens."""
        return self.prompts.stored(self.seq)

    def tail(self, start: int) -> np.ndarray:
        """`prompt[start:]`, without materializing the whole prompt when it is not already."""
        return self.prompt[start:] if "prompt" in self.__dict__ else self.prompts.prompt(self.seq, start)


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


def _stored(row: dict) -> Stored | None:
    """The row's prompt as stored: compact columns when the reader gave them, else its whole ids."""
    sampled = ids(row.get("completion_token_ids"))
    if row.get("prompt_suffix_ids") is not None:
        ref = row.get("prompt_ref_seq")
        return Stored(None if ref is None else int(ref), int(row.get("prompt_ref_len") or 0),
                      ids(row["prompt_suffix_ids"]), sampled)
    if row.get("prompt_token_ids") is not None:
        return Stored(None, 0, ids(row["prompt_token_ids"]), sampled)
    return None


def session_prompts(rows: list[dict]) -> Prompts:
    """The prompts of a session's rows (in seq order), whatever their status: later calls refer to them."""
    prompts = Prompts([])
    for row in rows:
        if (stored := _stored(row)) is not None:
            prompts.add(int(row["seq"]), stored)
    return prompts


def to_call(row: dict, prompts: Prompts) -> Call | None:
    """The row as a Call, or None when it lacks prompt or sampled ids (it cannot be trained on)."""
    if int(row["seq"]) not in prompts or row.get("completion_token_ids") is None:
        return None
    sampled = ids(row["completion_token_ids"])
    return Call(
        completion_id=row["completion_id"], seq=int(row["seq"]), sampled=sampled,
        logprobs=_aligned_logprobs(row, sampled), finish_reason=row.get("finish_reason"),
        empty_truncation=row.get("finish_reason") == "length" and not _visible(row, sampled), prompts=prompts,
        policy_version=row.get("policy_version"), tokenization=tokenization(row),
    )


def tokenization(row: dict) -> str:
    """`gateway` when the gateway rendered and tokenized the call's prompt (`--tokenize gateway`)."""
    metadata = row.get("metadata_json") or "{}"
    if '"tokenization"' not in metadata:  # most rows: no need to parse it
        return "upstream"
    try:
        return str(json.loads(metadata).get("tokenization") or "upstream")
    except (ValueError, AttributeError):
        return "upstream"


def trace_tokenization(calls: list[Call]) -> str | None:
    """Which tokenization produced a trace: `upstream`, `gateway`, or `mixed`; None without calls."""
    found = {call.tokenization for call in calls}
    return found.pop() if len(found) == 1 else ("mixed" if found else None)


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
    prompts = session_prompts(rows)
    calls, unusable = [], []
    for row in rows:
        if row.get("status") == "ok":
            call = to_call(row, prompts)
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
    response, spans = _response(parts)
    calls = [call for _, call in parts if call is not None]
    versions = list(dict.fromkeys(span["policy_version"] for span in spans if span["policy_version"] is not None))
    return {
        **fields, "builder": builder, "prompt_token_ids": prompt, **response, "status": status, "reward": None,
        "metadata_json": json.dumps({**metadata, "tokenization": trace_tokenization(calls), "spans": spans,
                                     "policy_versions": versions}),
    }


def _response(parts: list[tuple[np.ndarray, Call | None]]) -> tuple[dict, list[dict]]:
    """The response columns of a trace (ids, loss mask, logprobs or null) and each call's span in it."""
    lengths = [len(tokens) for tokens, _ in parts]
    starts = np.cumsum([0, *lengths]).tolist()
    sampled = [(start, tokens, call) for start, (tokens, call) in zip(starts[:-1], parts, strict=True)
               if call is not None]
    spans = [{"completion_id": call.completion_id, "start": start, "length": len(tokens),
              "policy_version": call.policy_version} for start, tokens, call in sampled]
    mask = np.repeat(np.array([call is not None for _, call in parts], dtype=np.int8), lengths)
    logprobs = None
    if all(call.logprobs is not None for _, _, call in sampled):
        logprobs = np.zeros(starts[-1], dtype=np.float32)  # 0.0 for interstitial context
        for start, tokens, call in sampled:
            logprobs[start:start + len(tokens)] = call.logprobs
    columns = {"response_token_ids": _concat([tokens for tokens, _ in parts], np.int32),
               "loss_mask": mask, "response_logprobs": logprobs}
    return columns, spans


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
        "completions_disconnected": sum(row.get("status") == "disconnected" for row in data.rows),  # left out
        "trainable": not data.reasons,
        "not_trainable_reasons": data.reasons,
    }


def _concat(chunks: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(chunks).astype(dtype, copy=False) if chunks else np.zeros(0, dtype=dtype)
