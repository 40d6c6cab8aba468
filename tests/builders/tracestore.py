"""Builder tests' store plumbing: completions written by the real writer, traces read back by DuckDB."""

from __future__ import annotations

import json
from pathlib import Path

from store_forms import as_form
from tracetap.store import StoreWriter, connect


def write_store(root: Path, rows: list[dict]) -> Path:
    """Record `rows` in order with the store writer (it assigns seq and completion ids)."""
    with StoreWriter(root) as writer:
        for row in rows:
            writer.record_completion({k: v for k, v in row.items() if k not in ("seq", "completion_id")})
    return as_form(root)


def read_traces(root: Path, builder: str, session_id: str = "s1") -> list[dict]:
    """The session's trajectories rows as stored, in trace order, metadata parsed."""
    query = "SELECT * FROM trajectories WHERE builder = ? AND session_id = ? ORDER BY trace_index"
    rows = connect(root).sql(query, params=[builder, session_id]).to_arrow_table().to_pylist()
    for row in rows:
        row["metadata"] = json.loads(row["metadata_json"])
    return rows


def read_completions(root: Path, session_id: str = "s1") -> list[dict]:
    query = "SELECT * FROM completions WHERE session_id = ? ORDER BY seq"
    return connect(root).sql(query, params=[session_id]).to_arrow_table().to_pylist()
