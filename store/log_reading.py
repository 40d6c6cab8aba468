"""Reading the group-commit log (store/commit_log.py): which sessions and seqs it holds, and its rows.

A line is a row when it is whole: it ends with the end mark (the row's last field) and parses. A line
cut by a crash lacks the mark and is never visible.
A reader shows a session's log rows the completions table does not hold yet (store/reading.py).

A segment only grows while its writer lives, so each process keeps an index of every segment it read
(where each session's lines are, not the rows) and extends it by what was appended since. On an object
store a segment is one batch, written once and never changed: it is read whole, once.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pyarrow as pa
from tracetap.store.commit_log import END_MARK
from tracetap.store.files import storage_schema
from tracetap.store.location import ObjectPath, StorePath, read_bytes, store_path
from tracetap.store.paths import log_segments
from tracetap.store.schema import STORED_COMPLETIONS

LINE_HEAD = re.compile(rb'\{"session_id":"([^"\\]+)","seq":(\d+),')
_STORAGE = storage_schema(STORED_COMPLETIONS)
_TIMESTAMPS = [f.name for f in STORED_COMPLETIONS if pa.types.is_timestamp(f.type)]

Span = tuple[int, int, int]  # (seq, start, end) of one whole line in its segment


@dataclass
class _Index:
    """Where the whole lines of one segment are, by session, up to `parsed` bytes."""

    inode: int
    parsed: int = 0
    sessions: dict[str, list[Span]] = field(default_factory=dict)


_INDEXES: dict[StorePath, _Index] = {}
_LOCK = threading.Lock()


def _scan(data: bytes, base: int, sessions: dict[str, list[Span]]) -> None:
    """Index the whole lines of `data` (which starts at byte `base` of its segment)."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        line = data[start:end]
        head = LINE_HEAD.match(line)
        if head and line.endswith(END_MARK):
            sid = head.group(1).decode()
            sessions.setdefault(sid, []).append((int(head.group(2)), base + start, base + end))
        start = end + 1


def _object_index(path: ObjectPath) -> dict[str, list[Span]]:
    """The whole lines of one segment object (immutable: indexed on its first read)."""
    with _LOCK:
        index = _INDEXES.get(path)
    if index is None:
        data = read_bytes(path)
        index = _Index(0, len(data))
        _scan(data, 0, index.sessions)
        with _LOCK:
            _INDEXES[path] = index
    return dict(index.sessions)


def _index(path: StorePath) -> dict[str, list[Span]]:
    """The whole lines of one segment by session, read as far as it is written now."""
    if isinstance(path, ObjectPath):
        return _object_index(path)
    with open(path, "rb") as handle, _LOCK:
        stat = os.fstat(handle.fileno())
        index = _INDEXES.get(path)
        if index is None or index.inode != stat.st_ino:
            index = _INDEXES[path] = _Index(stat.st_ino)
        handle.seek(index.parsed)
        data = handle.read(stat.st_size - index.parsed)
        cut = data.rfind(b"\n") + 1  # lines up to the last newline are final
        _scan(data[:cut], index.parsed, index.sessions)
        index.parsed += cut
        tail: dict[str, list[Span]] = {}
        _scan(data[cut:], index.parsed, tail)  # a last line without its newline, if whole
        sessions = dict(index.sessions)  # the lists only grow: callers may read them as they are
        for sid, spans in tail.items():
            sessions[sid] = sessions.get(sid, []) + spans
        return sessions


def _listed_index(path: StorePath) -> dict[str, list[Span]]:
    """_index, with a segment deleted since it was listed counting as empty: a writer deletes a segment only
    once the completions table holds all its rows, so a caller that reads the table after this call (not
    before) finds those rows there."""
    try:
        return _index(path)
    except FileNotFoundError:
        return {}


def segment_sessions(path: StorePath) -> dict[str, int]:
    """{session: highest seq} over the whole rows of one segment (none when it is gone: _listed_index)."""
    return {sid: max(seq for seq, _, _ in spans) for sid, spans in _listed_index(path).items()}


def log_seqs(root: StorePath | str, sid: str) -> list[int]:
    """The seqs of one session's whole rows in the log, from the index (no row is decoded); read the
    table after this call (_listed_index)."""
    return [seq for path in _segments(store_path(root)) for seq, _, _ in _listed_index(path).get(sid, [])]


def logged_sessions(root: StorePath | str) -> set[str]:
    """Every session with a whole row in the log; read the table after this call (_listed_index)."""
    return {sid for path in log_segments(root) for sid in segment_sessions(path)}


def _segments(root: StorePath) -> list[StorePath]:
    """The log's segments now; the index forgets deleted ones."""
    segments = log_segments(root)
    with _LOCK:
        for gone in set(_INDEXES) - set(segments):
            if gone.parent == root / "log":
                del _INDEXES[gone]
    return segments


def _decode(line: bytes) -> dict | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None  # a whole-looking line that does not parse is as invisible as a torn one
    for name in _TIMESTAMPS:
        if row.get(name) is not None:
            row[name] = datetime.fromisoformat(row[name])
    return row


def _read_rows(path: StorePath, spans: list[Span]) -> list[dict]:
    lines: Iterable[bytes]
    if isinstance(path, ObjectPath):
        data = read_bytes(path) if spans else b""  # one GET for the whole (small, immutable) batch
        lines = [data[start:end] for _, start, end in spans]
    else:
        lines = _local_lines(path, spans)
    return [row for line in lines if (row := _decode(line)) is not None]


def _local_lines(path: Path, spans: list[Span]) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        for _, start, end in spans:
            handle.seek(start)
            yield handle.read(end - start)


def log_rows(root: StorePath | str, sid: str | None = None, columns: list[str] | None = None,
             session_ids: Collection[str] | None = None) -> pa.Table:
    """The log's whole rows (of one session, of `session_ids`, or all), typed as the completions storage
    schema. A segment deleted meanwhile counts as empty: its writer deleted it once the completions table
    held its rows, so a caller that reads the table after this call finds them there."""
    wanted_ids = None if sid is None and session_ids is None else {*(session_ids or ()), *([sid] if sid else [])}
    rows = []
    for path in _segments(store_path(root)):
        sessions = _listed_index(path)
        chosen = sessions.values() if wanted_ids is None else [sessions.get(one, []) for one in wanted_ids]
        try:
            rows += _read_rows(path, sorted(span for spans in chosen for span in spans))
        except FileNotFoundError:
            continue
    target = _STORAGE if columns is None else pa.schema([_STORAGE.field(name) for name in columns])
    return pa.Table.from_pylist(rows, schema=target)
