"""The writer's table work (store/writer.py: its commits and its looks at what the tables hold), and where it runs.

deltalake loads a table's whole file list to commit to it or to look at it, and completions keep a file per
session per commit, so whatever does this work grows with the store: measured, ~4 KB of resident memory per
data file, which the process keeps after the work is done. A gateway has to stay flat however many sessions
it records (tests/capture/test_gateway_soak.py), so it runs the work in a spawned worker process of its own
(`Committer(isolated=True)`), which leaves its event loop the GIL too; a library writer runs it in its own
threads. Each function here is the unit of work sent over: its arguments and results are small (ids, rows of
sessions, counts), and the worker reads the logged calls from the log itself.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from tracetap.store import owners
from tracetap.store.compaction import commit_logged
from tracetap.store.delta import committed_seqs, open_table, replace, sql_in
from tracetap.store.delta import read as read_delta
from tracetap.store.files import StoreError, read_parquet
from tracetap.store.live_sessions import remove_committed
from tracetap.store.location import StorePath, remove
from tracetap.store.log_reading import log_rows, log_seqs, segment_sessions
from tracetap.store.paths import live_files, live_writer, log_segments, segment_writer
from tracetap.store.reading import read_completions, read_sessions
from tracetap.store.schema import SESSIONS
from tracetap.store.tables import rows_to_table

T = TypeVar("T")
WORKER = "from tracetap.store.committer import main; main()"
RECOUNT_COLUMNS = ["status", "http_status", "prompt_tokens", "completion_tokens", "created_at",
                   "finished_at", "task_id", "metadata_json", "chat_response_json"]


@dataclass(frozen=True)
class StoredSession:
    """What the store holds of one session, as a writer loads it."""

    row: dict | None  # its current row (a live file's or the table's); None when it has none
    committed: int  # calls the completions table holds (seqs 0..committed-1)
    next_seq: int  # one past its highest seq, logged or committed
    calls: list[dict] | None  # RECOUNT_COLUMNS of its calls when the row counts another number (a crash)


def load_session(root: StorePath, sid: str) -> StoredSession:
    """The session as stored: the log is read before the tables (store/reading.py)."""
    logged = log_seqs(root, sid)
    committed = committed_seqs(open_table(root, "completions"), [sid]).get(sid, 0)
    rows = read_sessions(root, [sid]).to_pylist()
    next_seq = max([committed, *(seq + 1 for seq in logged)])
    row = rows[0] if rows else None
    stale = (row["completions"] if row else 0) != next_seq
    calls = read_completions(root, [sid], RECOUNT_COLUMNS)[sid].to_pylist() if stale else None
    return StoredSession(row, committed, next_seq, calls)


def commit_sessions(root: StorePath, rows: list[dict], writer: str) -> dict[str, int]:
    """One commit of the logged calls of the sessions of `rows` the table lacks, then one of `rows`; returns how
    many calls the table holds now of each session that has logged calls."""
    sids = [row["session_id"] for row in rows]
    logged = log_rows(root, session_ids=sids)
    covered = commit_logged(root, logged, writer) if logged.num_rows else {}
    replace(root, "sessions", rows_to_table("sessions", rows), sql_in("session_id", sids), writer)
    return covered


def drop_covered(root: StorePath, segments: list[StorePath]) -> None:
    """Delete those of `segments` (closed ones: no batch goes to them again) whose every row the table holds."""
    tops = {path: segment_sessions(path) for path in segments}
    covered = committed_seqs(open_table(root, "completions"), {sid for top in tops.values() for sid in top})
    for path, top in tops.items():
        if all(seq < covered.get(sid, 0) for sid, seq in top.items()):
            remove(path)


def dead_writers(root: StorePath, me: str) -> list[str]:
    """The writers other than `me` that left a log segment, a live file or a heartbeat and beat no more."""
    found = {segment_writer(path) for path in log_segments(root)} | {live_writer(path) for path in live_files(root)}
    found |= set(owners.heartbeat_writers(root))
    return sorted(writer for writer in found - {None, me} if writer and not owners.alive(root, writer))


def writer_sessions(root: StorePath, writer: str) -> list[str]:
    """The sessions a writer logged calls of or kept a live row of."""
    logged = {sid for path in log_segments(root) if segment_writer(path) == writer for sid in segment_sessions(path)}
    live = [path for path in live_files(root) if live_writer(path) == writer]
    rows = read_parquet(live, SESSIONS, ["session_id"]) if live else None
    return sorted(logged | set(rows.column("session_id").to_pylist() if rows is not None else []))


def retire_writer(root: StorePath, writer: str) -> None:
    """Remove a taken-over writer's log segments the table holds, its live file (once the sessions table holds
    its rows) and its heartbeat."""
    drop_covered(root, [path for path in log_segments(root) if segment_writer(path) == writer])
    remove_committed(root, read_delta(open_table(root, "sessions"), "sessions"))
    owners.stop_beating(root, writer)


class Committer:
    """Runs the table work: right here (the caller's thread), or in one worker process (`isolated`), started at
    the first piece of work and again when it died. The worker runs `main` below, fed
    pickled work on its stdin and answering on its stdout, one piece at a time: it exits at the end of its
    stdin, so a writer killed outright leaves no process behind (a multiprocessing worker holds its queue's
    write end and stays). Not forked: deltalake's runtime hangs in a fork."""

    def __init__(self, isolated: bool) -> None:
        self._isolated = isolated
        self._lock = threading.Lock()  # one piece of work in the worker at a time
        self._worker: subprocess.Popen[bytes] | None = None

    def run(self, work: Callable[..., T], *args: object) -> T:
        """`work(*args)`'s result (or its exception), once it ran; work that met a dead worker runs once more
        in a new one (every piece is safe to repeat: a commit replaces exactly the rows it adds)."""
        if not self._isolated:
            return work(*args)
        request = pickle.dumps((work, args))
        with self._lock:
            try:
                ok, result = self._exchange(request)
            except (BrokenPipeError, EOFError):
                self._stop()
                ok, result = self._exchange(request)
        if not ok:
            raise result
        return result

    def _exchange(self, request: bytes) -> tuple[bool, Any]:
        if self._worker is None or self._worker.poll() is not None:
            self._worker = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE)
        assert self._worker.stdin is not None and self._worker.stdout is not None
        _send(self._worker.stdin, request)
        return pickle.loads(_receive(self._worker.stdout))

    def _stop(self) -> None:
        if self._worker is not None:
            with suppress(OSError):
                self._worker.stdin.close()  # type: ignore[union-attr]
            self._worker.wait()
            self._worker = None

    def close(self) -> None:
        """Stop the worker (it ends once its stdin does)."""
        with self._lock:
            self._stop()


def _send(stream: IO[bytes], data: bytes) -> None:
    stream.write(len(data).to_bytes(8, "big") + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> bytes:
    size = stream.read(8)
    if len(size) < 8:
        raise EOFError("the committer process ended")
    return stream.read(int.from_bytes(size, "big"))


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """The worker's loop: run each piece of work, answer (True, result) or (False, the exception)."""
    while (size := requests.read(8)) and len(size) == 8:
        work, args = pickle.loads(requests.read(int.from_bytes(size, "big")))
        _send(answers, _answer(work, args))


def _answer(work: Callable[..., object], args: tuple) -> bytes:
    """(True, the result) or (False, the exception), pickled; an exception that would not come through
    pickling whole (one whose class takes other arguments) comes as a StoreError with its message."""
    try:
        return pickle.dumps((True, work(*args)))
    except Exception as error:
        try:
            return pickle.dumps((False, pickle.loads(pickle.dumps(error))))
        except Exception:
            return pickle.dumps((False, StoreError(f"{type(error).__name__}: {error}")))


def main() -> None:
    """The worker process (WORKER)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the group: its writer's close still commits here
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # whatever prints goes to stderr, not into the answers
    _serve(sys.stdin.buffer, answers)
