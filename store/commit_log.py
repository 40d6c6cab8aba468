"""The group-commit log: calls that finish close together share one append and one fdatasync.

Each StoreWriter owns one log under `log/`, named by a random writer id: segments
`<writer-id>-<n:06d>.jsonl`, one completions row (its storage form) per line. A caller hands `submit`
its row; a committer thread takes every row queued since its last write, checks them against the
schema in one check (store/tables.py: one Arrow conversion per list column, plain checks for scalars),
encodes them, appends the lines with one write and one fdatasync (a new segment also fsyncs the
directory, so its name survives a crash), then tells each row's caller, through the callback it was
queued with, that its line is durable, or why not. A row that does not fit the schema never reaches
the log and does not fail the rest of its batch. Callers wait for that callback, not for the
committer: the gateway's event loop is woken by it directly, with no thread parked per call. A caller
with nothing else to do (the gateway serving one call) may write the queue itself when no batch is
being written (`write_now`): the same check, write and sync, without the hand-offs to the committer.

Every line ends with the end mark (`"_end":1`, after the schema's last column): a line cut by a crash
lacks it and is never visible (store/log_reading.py). A failed write may leave such a torn tail, so
the segment is retired and the next batch starts a new one: a torn tail always ends its segment and
is never glued to a later line. Segments rotate past `segment_bytes`; compaction moves their rows
into part files and the writer deletes a segment (never the live one) once parts cover all its rows.

On an object store (store/location.py) an object cannot be appended to, and a PUT is atomic and durable
once it returns: there each batch is one segment object, written with one PUT, and no segment is live.
The log then lives in the bucket with the rest of the store, so an acknowledged call survives the loss
of the gateway's machine, readers see it at once, and gateways on several machines share the store,
each writing its own segments (their writer ids differ). A torn object cannot exist, so a failed PUT
leaves nothing behind.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tracetap.store.files import StoreError
from tracetap.store.location import ObjectPath, StorePath, ensure_dir, fsync_dir, write_atomic
from tracetap.store.paths import segment_name
from tracetap.store.schema import STORED_COMPLETIONS
from tracetap.store.tables import check_rows

END_MARK = b',"_end":1}'
SEGMENT_BYTES = 64 << 20  # a segment past this size is closed and a new one started
_COLUMNS = STORED_COMPLETIONS.names  # session_id and seq come first: log_reading indexes lines by them

log = logging.getLogger(__name__)
Landed = Callable[[Exception | None], None]  # told None once its line is durable, else why not


def _plain(value: object) -> object:
    """JSON for what json cannot write itself: timestamps as ISO 8601 (exact to the microsecond,
    naive ones taken as UTC, as Arrow does), numpy values as Python ones."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise ValueError(f"cannot store a {type(value).__name__} in the log")


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=_plain)  # made once, not per line as json.dumps would


def encode_line(row: dict) -> bytes:
    """One completions row as one log line: the schema's columns in order, then the end mark.

    Floats are written as Python's repr of the double, which parses back to the same double, so
    the float32 both readers cast it to is the one a Parquet write of the row stores.
    """
    body = _ENCODER.encode({name: row.get(name) for name in _COLUMNS})
    return body[:-1].encode() + END_MARK + b"\n"


@dataclass
class _Pending:
    row: dict
    landed: Landed


def _lines(rows: list[dict]) -> list[bytes | ValueError]:
    """Each row's log line, or why it does not fit the schema."""
    try:
        check_rows("completions", rows)
        return [encode_line(row) for row in rows]
    except (ValueError, TypeError, RecursionError):
        return [_line_or_misfit(row) for row in rows]


def _line_or_misfit(row: dict) -> bytes | ValueError:
    """Whatever a row holds, an error for it and never for the committer: a dead committer would leave
    every later call waiting."""
    try:
        check_rows("completions", [row])
        return encode_line(row)
    except ValueError as misfit:
        return misfit
    except (TypeError, RecursionError) as misfit:
        return ValueError(f"completions row cannot be logged: {misfit}")


class CommitLog:
    """One writer's append-only log; a row's callback runs once its line is on disk."""

    def __init__(self, directory: StorePath, writer_id: str, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = directory
        self.writer_id = writer_id
        self.segment_bytes = segment_bytes
        segment_name(writer_id, 0)  # checks the id before anything runs
        self._cond = threading.Condition()
        self._queue: list[_Pending] = []
        self._closed = False
        self._writing = False  # a batch is being written (by the committer or by `write_now`'s caller)
        self._number = 0
        self._fd: int | None = None
        self._size = 0
        self._live: StorePath | None = None
        self._segment_lock = threading.Lock()  # the live segment changes only under it
        self._thread = threading.Thread(target=self._run, name="tracetap-committer", daemon=True)
        self._thread.start()

    def retired(self, path: StorePath) -> bool:
        """Whether no batch can go to the segment `path` again (any segment but the live one)."""
        with self._segment_lock:
            return path != self._live

    def submit(self, row: dict, landed: Landed, wake: bool = True) -> None:
        """Queue one completions row (storage form); the committer thread calls `landed` once its line is
        durable (with None), or with the ValueError of a row that does not fit the schema or the
        OSError of a failed write. Lines reach the disk in submit order. `wake=False` leaves the
        committer asleep for a caller that calls `write_now` next."""
        with self._cond:
            if self._closed:
                raise StoreError(f"the log {self.directory}/{self.writer_id}-* is closed")
            self._queue.append(_Pending(row, landed))
            if wake:
                self._cond.notify_all()

    def write_now(self) -> bool:
        """Write what is queued here, in the caller's thread, when no batch is being written: a lone call's
        line then waits for no thread hand-off (its callback runs here too). False when the committer
        is busy or nothing is queued (it is woken to write what is)."""
        with self._cond:
            if self._writing or not self._queue or self._closed:
                self._cond.notify_all()
                return False
            batch, self._queue, self._writing = self._queue, [], True
        self._commit(batch)
        return True

    def retire_live(self) -> None:
        """Close the live segment now (the next batch starts a new one), between batches: a segment whose
        rows parts all cover can then be deleted instead of waiting to fill up."""
        with self._cond:
            self._cond.wait_for(lambda: not self._writing)
            self._writing = True  # no batch starts while the segment changes
        try:
            self._retire()
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def close(self) -> None:
        """Write what is queued, then stop the committer and close the segment."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self._retire()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: (self._queue or self._closed) and not self._writing)
                if not self._queue:
                    return
                batch, self._queue, self._writing = self._queue, [], True
            self._commit(batch)

    def _commit(self, batch: list[_Pending]) -> None:
        """Check, encode and write one batch, tell each row's caller how its line fared, then let the
        next batch be written (the writer that took it set `_writing`)."""
        try:
            lines = _lines([pending.row for pending in batch])
            error = self._write(b"".join(line for line in lines if isinstance(line, bytes)))
            for pending, line in zip(batch, lines, strict=True):
                try:
                    pending.landed(line if isinstance(line, ValueError) else error)
                except Exception:  # one caller's bookkeeping must not stop the others' acknowledgements
                    log.exception("a commit-log callback failed")
        finally:
            with self._cond:
                self._writing = False
                if self._queue or self._closed:  # else the committer has nothing to do: waking it would
                    self._cond.notify_all()  # only cost the event loop a GIL hand-off per lone call

    def _write(self, data: bytes) -> OSError | None:
        """Append one batch with one write and one fdatasync. A failure cuts the segment back to where
        the batch began (its callers get an error, so none of its lines may stay whole: their seqs are
        given again) and retires it. On an object store the batch is one new segment object."""
        if isinstance(self.directory, ObjectPath):
            return self._put(self.directory, data)
        try:
            fd = self._segment()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fdatasync(fd)
        except OSError as error:
            self._cut_back()
            return error
        self._size += len(data)
        if self._size >= self.segment_bytes:
            self._retire()
        return None

    def _put(self, directory: ObjectPath, data: bytes) -> OSError | None:
        path = directory / segment_name(self.writer_id, self._number)
        self._number += 1
        try:
            write_atomic(path, lambda handle: handle.write(data))
        except Exception as error:  # any failure of the PUT (a client error too) fails the batch's callers
            return error if isinstance(error, OSError) else OSError(f"PUT {path}: {error}")
        return None

    def _segment(self) -> int:
        """The open live segment, created (and its name made durable) when there is none."""
        with self._segment_lock:
            return self._open_segment() if self._fd is None else self._fd

    def _open_segment(self) -> int:
        assert isinstance(self.directory, Path), "an object store log has no open segment"
        ensure_dir(self.directory)
        path = self.directory / segment_name(self.writer_id, self._number)
        self._number += 1
        self._live = path  # before the file exists: retired() never takes it for a closed one
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._size = 0
        fsync_dir(self.directory)
        return self._fd

    def _cut_back(self) -> None:
        with suppress(OSError):  # a disk that cannot even truncate fails the next writes too
            if self._fd is not None:
                os.ftruncate(self._fd, self._size)
                os.fdatasync(self._fd)
        self._retire()

    def _retire(self) -> None:
        with self._segment_lock:
            if self._fd is not None:
                os.close(self._fd)
            self._fd, self._live = None, None
