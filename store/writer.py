"""The durable, thread-safe writer the gateway records every call with.

One file per completion (`completions/session_id=<sid>/<seq:08d>-<completion_id>.parquet`), written
atomically and fsync'd before `record_completion` returns, then the session's one-row summary is
rewritten. Session state lives in memory after its first touch, so a write never re-reads the store.
Writes to one session are serialized (seqs hit the disk in order, which compaction relies on);
different sessions write in parallel. One writer process per store: a lock file enforces it.
"""

from __future__ import annotations

import fcntl
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from store import compaction
from store.files import StoreError, ensure_dir, read_parquet, read_version, write_parquet_atomic, write_text_atomic
from store.paths import VERSION_FILE, completion_name, session_dir, session_file, validate_name, validate_session_id
from store.schema import COMPLETION_STATUSES, COMPLETIONS, SCHEMA_VERSION, SESSIONS, TABLES, empty_row
from store.tables import rows_to_table

FAILED = ("upstream_error", "timeout")
_RECOUNT_COLUMNS = ["status", "http_status", "prompt_tokens", "completion_tokens", "created_at",
                    "finished_at", "task_id", "metadata_json"]


@dataclass
class _Session:
    """What the writer knows about one session; guarded by `lock`."""

    directory: Path
    row: dict
    next_seq: int
    failures: dict = field(default_factory=dict)
    last_write: float = 0.0
    dirty: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def new_completion_id() -> str:
    return "cmpl-" + secrets.token_hex(12)


def _harness(metadata_json: str | None) -> str | None:
    """The harness name a completion's metadata carries (`{"harness": ...}`), if any."""
    try:
        metadata = json.loads(metadata_json) if metadata_json else None
    except ValueError:
        return None
    return metadata.get("harness") if isinstance(metadata, dict) else None


def _failure_kind(completion: dict) -> str:
    if completion["status"] == "timeout":
        return "timeout"
    status = completion.get("http_status")
    return f"http_{status}" if status else "transport"


def _apply(state: _Session, completion: dict) -> None:
    """Fold one recorded completion into the session summary."""
    row = state.row
    row["completions"] += 1
    if completion["status"] == "ok":
        row["prompt_tokens"] += completion.get("prompt_tokens") or 0
        row["completion_tokens"] += completion.get("completion_tokens") or 0
    elif completion["status"] in FAILED:
        kind = _failure_kind(completion)
        state.failures[kind] = state.failures.get(kind, 0) + 1
        state.failures.update(last_at=row["completions"], last_kind=kind)
    row["started_at"] = row["started_at"] or completion.get("created_at") or completion["finished_at"]
    row["ended_at"] = completion["finished_at"]
    row["task_id"] = row["task_id"] or completion.get("task_id")
    row["harness"] = row["harness"] or _harness(completion.get("metadata_json"))
    row["status"] = "open"


def _new_row(sid: str) -> dict:
    return {**empty_row(SESSIONS), "session_id": sid, "status": "open",
            "completions": 0, "prompt_tokens": 0, "completion_tokens": 0}


class StoreWriter:
    """Append-only writer for one store directory (created with its layout when missing)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._owner = self._open_store()

    def _open_store(self):
        for table in (None, *TABLES):
            ensure_dir(self.root / table if table else self.root)
        version = read_version(self.root)
        if version is not None and version > SCHEMA_VERSION:
            raise StoreError(f"store {self.root} has schema version {version}; this tracetap writes {SCHEMA_VERSION}")
        if version is None:
            write_text_atomic(self.root / VERSION_FILE, f"{SCHEMA_VERSION}\n")
        owner = open(self.root / ".writer.lock", "a")
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner.close()
            raise StoreError(f"store {self.root} is already open in another StoreWriter") from None
        return owner

    def close(self) -> None:
        """Release the store (pending sessions stay as they are on disk; nothing is lost)."""
        self._owner.close()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def record_completion(self, row: dict) -> dict:
        """Durably record one call; fills seq, completion_id (if missing) and finished_at.

        `row` holds completions columns (missing ones are null); returns the full stored row.
        """
        sid = validate_session_id(row.get("session_id"))
        completion_id = validate_name(row.get("completion_id") or new_completion_id(), "completion id")
        if row.get("status") not in COMPLETION_STATUSES:
            raise ValueError(f"status must be one of {COMPLETION_STATUSES}, got {row.get('status')!r}")
        state = self._state(sid)
        with state.lock:
            full = {**empty_row(COMPLETIONS), **row, "session_id": sid, "seq": state.next_seq,
                    "completion_id": completion_id, "finished_at": row.get("finished_at") or datetime.now(UTC)}
            table = rows_to_table("completions", [full])
            write_parquet_atomic(state.directory / completion_name(state.next_seq, completion_id), table)
            state.next_seq += 1
            _apply(state, full)
            self._save(state)
            state.last_write, state.dirty = time.monotonic(), True
        return full

    def register_session(self, sid: str, task_id: str | None = None, harness: str | None = None,
                         metadata: dict | None = None) -> dict:
        """Create or annotate a session row; task_id and harness keep the first non-empty value."""
        state = self._state(validate_session_id(sid))
        with state.lock:
            row = state.row
            row["task_id"] = row["task_id"] or task_id
            row["harness"] = row["harness"] or harness
            if metadata:
                row["metadata_json"] = json.dumps({**json.loads(row["metadata_json"] or "{}"), **metadata})
            self._save(state)
            return dict(row)

    def close_session(self, sid: str) -> dict:
        """Compact the session's files and mark it closed; returns the session row."""
        state = self._state(validate_session_id(sid))
        with state.lock:
            compaction.compact_dir(state.directory)
            state.row.update(status="closed", ended_at=datetime.now(UTC))
            self._save(state)
            state.dirty = False
            return dict(state.row)

    def compact_idle(self, idle_seconds: float) -> list[str]:
        """Compact sessions with new files and no write for `idle_seconds`; returns their ids."""
        with self._lock:
            states = list(self._sessions.items())
        done = []
        for sid, state in states:
            with state.lock:
                if state.dirty and time.monotonic() - state.last_write >= idle_seconds:
                    compaction.compact_dir(state.directory)
                    state.dirty = False
                    done.append(sid)
        return done

    def _state(self, sid: str) -> _Session:
        with self._lock:
            if sid not in self._sessions:
                self._sessions[sid] = self._load(sid)
            return self._sessions[sid]

    def _load(self, sid: str) -> _Session:
        """Session state from disk; the summary is recounted when a crash left it behind."""
        directory = session_dir(self.root, "completions", sid)
        path = session_file(self.root, sid)
        rows = read_parquet([path], SESSIONS).to_pylist() if path.exists() else []
        state = _Session(directory, rows[0] if rows else _new_row(sid), compaction.next_seq(directory))
        state.failures = json.loads(state.row["upstream_failures_json"] or "{}")
        if state.row["completions"] != state.next_seq:
            self._recount(state)
        return state

    def _recount(self, state: _Session) -> None:
        table = read_parquet(compaction.live_files(state.directory), COMPLETIONS, _RECOUNT_COLUMNS)
        state.row.update(completions=0, prompt_tokens=0, completion_tokens=0, started_at=None)
        state.failures = {}
        for completion in table.to_pylist():
            _apply(state, completion)

    def _save(self, state: _Session) -> None:
        state.row["upstream_failures_json"] = json.dumps(state.failures) if state.failures else None
        path = session_file(self.root, state.row["session_id"])
        write_parquet_atomic(path, rows_to_table("sessions", [state.row]))
