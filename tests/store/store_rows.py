"""Helpers for store tests: a completions row factory, a snapshot of the files on disk, rows stored as a
crashed writer (only in the log) left them, and what the completions Delta table and the log hold."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def completion(sid: str = "s1", status: str = "ok", **columns) -> dict:
    """A plausible completions row (the writer fills seq, completion_id, finished_at)."""
    row = {"session_id": sid, "status": status, "api": "openai_chat", "path": "/v1/chat/completions",
           "prompt_token_ids": [1, 2, 3], "completion_token_ids": [4, 5], "logprobs": [-0.5, -0.25],
           "prompt_tokens": 3, "completion_tokens": 2}
    return {**row, **columns}


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes: equal snapshots mean nothing on disk changed."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


CRASHING_WRITER = """
import os, pickle, sys
from tracetap.store import StoreWriter
writer = StoreWriter(sys.argv[1])
stored = [writer.record_completion(row) for row in pickle.load(sys.stdin.buffer)]
if sys.argv[2:] == ["flush"]:
    writer.flush()  # its live session rows written
sys.stdout.buffer.write(pickle.dumps((writer.writer_id, stored)))
sys.stdout.flush()
os._exit(0)  # no close, as after kill -9
"""


def abandoned_writer_store(root: Path, rows: list[dict], flush: bool = False) -> list[dict]:
    """Record `rows` with a writer in a subprocess that then dies without closing (a close would commit
    them): they are left only in the group-commit log, as a crashed gateway leaves them (`flush`: with its
    live session rows written, else most likely without), and its heartbeat stale. Returns the rows as stored."""
    done = subprocess.run([sys.executable, "-c", CRASHING_WRITER, str(root), *(["flush"] if flush else [])],
                          input=pickle.dumps(rows),
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    writer_id, stored = pickle.loads(done.stdout)
    stop_heart(root, writer_id)
    return stored


def stop_heart(root: Path, writer_id: str) -> None:
    """Make a writer's last heartbeat an hour old: it is dead, as if a minute had passed since it died."""
    beat = root / "writers" / f"{writer_id}.json"
    beat.write_text(json.dumps({"writer": writer_id, "at": time.time() - 3600}))


def table_calls(root: Path) -> dict[str, list[int]]:
    """{session: its seqs, sorted} as the completions Delta table itself holds them (read with deltalake, no
    log): a call the table holds twice shows twice. Empty before the table's first commit."""
    from deltalake import DeltaTable

    if not (root / "completions" / "_delta_log").is_dir():
        return {}
    table = DeltaTable(str(root / "completions")).to_pyarrow_table(columns=["session_id", "seq"])
    calls: dict[str, list[int]] = {}
    for sid, seq in sorted(zip(table.column("session_id").to_pylist(), table.column("seq").to_pylist(), strict=True)):
        calls.setdefault(sid, []).append(seq)
    return calls


def log_names(root: Path) -> list[str]:
    """The files in the store's `log/` (writers' segments and live session files), sorted."""
    directory = root / "log"
    return sorted(path.name for path in directory.iterdir()) if directory.is_dir() else []


def wait_for(condition: Callable[[], object], timeout: float = 60.0) -> bool:
    """Poll `condition` until it holds or `timeout` seconds passed; whether it holds."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(condition())
