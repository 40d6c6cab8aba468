"""Helpers for store tests: a completions row factory and a snapshot of the files on disk."""

from __future__ import annotations

from pathlib import Path

from tracetap.store.compaction import next_seq
from tracetap.store.files import write_parquet_atomic
from tracetap.store.paths import completion_name, session_dir
from tracetap.store.tables import rows_to_table


def completion(sid: str = "s1", status: str = "ok", **columns) -> dict:
    """A plausible completions row (the writer fills seq, completion_id, finished_at)."""
    row = {"session_id": sid, "status": status, "api": "openai_chat", "path": "/v1/chat/completions",
           "prompt_token_ids": [1, 2, 3], "completion_token_ids": [4, 5], "logprobs": [-0.5, -0.25],
           "prompt_tokens": 3, "completion_tokens": 2}
    return {**row, **columns}


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes: equal snapshots mean nothing on disk changed."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def record_files(root: Path, count: int, sid: str = "s1") -> list[dict]:
    """Per-completion files as a v1 writer left them (still read and compacted); returns their rows."""
    directory = session_dir(root, "completions", sid)
    start = next_seq(directory)
    rows = [{**completion(sid, prompt_token_ids=[seq]), "seq": seq, "completion_id": f"c-{seq}"}
            for seq in range(start, start + count)]
    for row in rows:
        write_parquet_atomic(directory / completion_name(row["seq"], row["completion_id"]),
                             rows_to_table("completions", [row]))
    return rows
