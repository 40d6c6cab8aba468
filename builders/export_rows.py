"""Row shapes of the training exports: canonical, slime samples and verl rows.

The canonical row is a trajectories row plus `group_id` and `evaluator`; slime and verl rows are
derived from it. Trainer-facing shapes (slime, verl) never train on a trace that is not `ok`: its
loss mask is all 0 there (slime also sets `remove_sample`), while the canonical row keeps it as built.
A missing reward becomes 0.0 in trainer shapes, flagged `reward_missing`; it stays null in canonical.
"""

from __future__ import annotations

import json

import pyarrow as pa
from tracetap.store import TABLES, storage_schema

_T = storage_schema(TABLES["trajectories"])
_IDS = pa.list_(pa.int32())
_MASK = pa.list_(pa.int8())

CANONICAL = pa.schema(
    [_T.field("session_id"), _T.field("task_id"), pa.field("group_id", pa.string()),
     _T.field("builder"), pa.field("evaluator", pa.string())]
    + [_T.field(name) for name in _T.names if name not in ("session_id", "task_id", "builder")]
)

VERL_EXTRA = pa.struct([
    ("session_id", pa.string()), ("task_id", pa.string()), ("builder", pa.string()),
    ("evaluator", pa.string()), ("trace_index", pa.int32()), ("chain_index", pa.int32()),
    ("segment_index", pa.int32()), ("finish_reason", pa.string()), ("break_reason", pa.string()),
    ("reward_missing", pa.bool_()), ("metadata_json", pa.string()),
])
VERL = pa.schema([
    ("uid", pa.string()), ("prompt_ids", _IDS), ("response_ids", _IDS), ("input_ids", _IDS),
    ("attention_mask", _MASK), ("response_mask", _MASK), ("rollout_log_probs", pa.list_(pa.float32())),
    ("reward_score", pa.float64()), ("num_turns", pa.int32()), ("status", pa.string()),
    ("extra_info", VERL_EXTRA),
])


def canonical_row(trace: dict, session: dict, evaluator: str | None) -> dict:
    """One canonical export row from a (joined) trajectories row and its session's info."""
    row = {name: trace.get(name) for name in CANONICAL.names}
    row.update(task_id=trace.get("task_id") or session.get("task_id"), group_id=session["group_id"],
               evaluator=evaluator)
    return row


def _list(values) -> list:
    return [] if values is None else list(values)


def _trainable(row: dict) -> bool:
    return row.get("status") == "ok"


def slime_status(row: dict, metadata: dict) -> str:
    """slime's Sample.Status value: failed (not ok), aborted, truncated (length or clipped), completed."""
    if not _trainable(row):
        return "failed"
    if row.get("finish_reason") == "abort":
        return "aborted"
    if row.get("finish_reason") == "length" or "token_clipping" in metadata:
        return "truncated"
    return "completed"


def slime_sample(row: dict, index: int, group_index: int, rollout_id: int) -> dict:
    """A dict `slime.utils.types.Sample.from_dict` accepts (tokens = prompt + response)."""
    metadata = json.loads(row["metadata_json"]) if row.get("metadata_json") else {}
    prompt, response = _list(row["prompt_token_ids"]), _list(row["response_token_ids"])
    mask = _list(row["loss_mask"]) if _trainable(row) else [0] * len(response)
    logprobs = row.get("response_logprobs")
    info = {key: row.get(key) for key in ("session_id", "task_id", "group_id", "builder", "evaluator",
                                          "trace_index", "chain_index", "segment_index", "completion_ids",
                                          "finish_reason", "break_reason")}
    info.update(trace_status=row.get("status"), rollout_id=rollout_id,
                reward_missing=row.get("reward") is None, trace=metadata)
    return {
        "group_index": group_index, "index": index, "session_id": row["session_id"],
        "tokens": prompt + response, "response_length": len(response), "loss_mask": mask,
        "rollout_log_probs": None if logprobs is None else [float(v) for v in logprobs],
        "reward": 0.0 if row.get("reward") is None else row["reward"],
        "status": slime_status(row, metadata), "remove_sample": not _trainable(row),
        "metadata": {"tracetap": info},
    }


def verl_row(row: dict) -> dict:
    """A verl agent-loop style row: unpadded ids and masks; `reward_score` is the sequence reward.

    verl pads at batch time and puts `reward_score` on the last response token (token-level scores).
    """
    prompt, response = _list(row["prompt_token_ids"]), _list(row["response_token_ids"])
    mask = _list(row["loss_mask"]) if _trainable(row) else [0] * len(response)
    extra = {name: row.get(name) for name in VERL_EXTRA.names if name != "reward_missing"}
    return {
        "uid": row["group_id"], "prompt_ids": prompt, "response_ids": response,
        "input_ids": prompt + response, "attention_mask": [1] * (len(prompt) + len(response)),
        "response_mask": mask, "rollout_log_probs": row.get("response_logprobs"),
        "reward_score": 0.0 if row.get("reward") is None else row["reward"],
        "num_turns": len(_list(row.get("completion_ids"))), "status": row.get("status"),
        "extra_info": {**extra, "reward_missing": row.get("reward") is None},
    }
