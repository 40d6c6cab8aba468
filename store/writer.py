"""The durable, thread-safe writer the gateway records every call with.

Every completion is one line of the writer's group-commit log (store/commit_log.py): calls that finish
together share one append and one fdatasync, and `record_completion` returns once its line is durable; then
the session's one-row summary is rewritten. The line holds the row's compact form (store/compact_form.py:
only what is new since the session's earlier calls); each cached session keeps the encoder's History (at
most 1 MiB of chain tips, 128 KiB of chunk keys twice: in order and sorted, and the 4 latest bodies of each
kind, 1 MiB of text per kind, with 25 B a chunk of where their chunks are and their keys; a session dropped
from the cache starts a fresh one). Compaction moves the log rows into part files (on close_session,
compact_idle, eviction and the writer's close: a store at rest holds each call once) and segments whose rows
parts cover are deleted (a grace period later, as every file a compaction supersedes: store/retirement.py, so
reads that listed it can still open it), the live one too once every row the writer logged is in parts. A writer
opening the store recovers the log a dead one left: its whole rows are compacted, torn tails dropped.
Session state lives in memory after its first touch, so a write never re-reads the store. Writes to one
session are serialized: a session has at most one line in flight (seqs hit the disk in order, which
compaction relies on, and a failed write gives its seq back without a gap); different sessions write in
parallel. The gateway records from its event loop (`record_completion_async`): the row is encoded there and
the committer wakes the loop when it is durable, so no thread waits per call. The summary row is rewritten
by a background thread shortly after each call (it is derived: a writer opening the store recounts every row
a crash left stale), and synchronously by register_session, close_session, flush and close. One writer
process per store: a lock file enforces it.

On an object store (`s3://bucket/prefix`, store/location.py) files are single PUTs and the log is one
object per batch (store/commit_log.py), so gateways on several machines can share one store: there is
no writer lock, each gateway records its own sessions (a session's seqs are assigned in one writer's
memory, so one session must go through one gateway at a time), and one opening the store recovers every
log object it finds (compacting a live gateway's rows too is safe: parts are named by what they cover).

Memory stays bounded however many sessions a long-lived gateway sees: past `max_sessions` cached
states, the least recently used ones whose summary row is on disk are compacted and dropped (a later
call to such a session loads it again from disk, exactly as after a restart).
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import json
import secrets
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from typing import IO

from tracetap.store import compaction
from tracetap.store.commit_log import SEGMENT_BYTES, CommitLog
from tracetap.store.compact_form import History, encode_row
from tracetap.store.files import (
    StoreError,
    outdated,
    read_parquet,
    read_version,
    write_parquet_atomic,
    write_text_atomic,
)
from tracetap.store.flusher import Flusher
from tracetap.store.location import ObjectPath, StorePath, ensure_dir, exists, is_dir, store_path
from tracetap.store.log_reading import logged_sessions, segment_sessions
from tracetap.store.paths import (
    LOG_DIR,
    TABLE_DEPTH,
    VERSION_FILE,
    log_segments,
    session_dir,
    session_file,
    session_of,
    validate_name,
    validate_session_id,
)
from tracetap.store.reading import read_session
from tracetap.store.retirement import GRACE_SECONDS, Retirement
from tracetap.store.schema import (
    COMPLETION_STATUSES,
    COMPLETIONS,
    MAX_REFUSED_HOSTS,
    OTHER_HOSTS,
    SCHEMA_VERSION,
    SESSIONS,
    UNRECORDED_KINDS,
    empty_row,
)
from tracetap.store.snapshot import partitions, visible
from tracetap.store.tables import rows_to_table

FAILED = ("upstream_error", "timeout", "aborted", "disconnected")
SESSION_SAVE_DELAY = 0.5  # seconds the calls of a session wait to share one summary-row rewrite (derived
# data, recounted on open; at 0.05 s a busy gateway rewrote ~1 row per call, ~0.7 ms CPU each)
MAX_SESSIONS = 1024  # session states kept in memory (a few KB each); older idle ones are dropped
MAX_HOST = 255  # a DNS name is at most 253 characters; a refused host longer than this is not one
_RECOUNT_COLUMNS = ["status", "http_status", "prompt_tokens", "completion_tokens", "created_at",
                    "finished_at", "task_id", "metadata_json", "chat_response_json"]


@dataclass
class _InFlight:
    """One completion line between its queueing and the committer's word on it."""

    row: dict
    notify: Callable[[], None] | None  # run in the committer thread once the line landed or failed
    settled: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None  # a row that does not fit the schema (ValueError), a failed write

    def land(self, error: Exception | None) -> None:
        self.error = error
        self.settled.set()
        if self.notify is not None:
            self.notify()

    def result(self) -> dict:
        self.settled.wait()
        if isinstance(self.error, ValueError):
            raise self.error
        if self.error is not None:
            raise StoreError(f"could not write the log: {self.error}") from self.error
        return self.row


@dataclass
class _Session:
    """What the writer knows about one session; guarded by `lock`."""

    directory: StorePath
    path: StorePath
    row: dict
    next_seq: int
    failures: dict = field(default_factory=dict)
    unrecorded: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)  # host -> refusals (proxy mode)
    last_write: float = 0.0
    dirty: bool = False  # has files compaction has not merged yet
    version: int = 0  # bumped on every change of the summary; `saved` is the version on disk
    saved: int = 0
    evicted: bool = False  # dropped from the cache: whoever holds this state must fetch a fresh one
    history: History = field(default_factory=History)  # what the compact encoder can refer to
    in_flight: _InFlight | None = None  # the line queued in the log and not yet durable (at most one)
    lock: threading.Lock = field(default_factory=threading.Lock)
    save_lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> dict:
        return {**self.row, "upstream_failures_json": _json_or_none(self.failures),
                "unrecorded_json": _json_or_none(self.unrecorded), "refused_hosts_json": _json_or_none(self.refused)}


def _json_or_none(counts: dict) -> str | None:
    return json.dumps(counts) if counts else None


def new_completion_id() -> str:
    return "cmpl-" + secrets.token_hex(12)


def _metadata(completion: dict) -> dict:
    try:
        metadata = json.loads(completion.get("metadata_json") or "{}")
    except ValueError:
        return {}
    return metadata if isinstance(metadata, dict) else {}


def _failure_kind(completion: dict) -> str:
    """http_<status> | timeout | transport. The gateway may say which in metadata `upstream_failure`
    (http | timeout | unreachable | invalid); without it, a recorded upstream body means HTTP."""
    said = _metadata(completion).get("upstream_failure")
    if completion["status"] == "timeout" or said == "timeout":
        return "timeout"
    answered = said == "http" if said else completion.get("chat_response_json") is not None
    status = completion.get("http_status")
    return f"http_{status}" if answered and status else "transport"


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
    row["harness"] = row["harness"] or _metadata(completion).get("harness")
    row["status"] = "open"


def _checked(row: dict) -> tuple[str, str]:
    """The row's session id and completion id (made when missing), both checked, and its status."""
    sid = validate_session_id(row.get("session_id"))
    completion_id = validate_name(row.get("completion_id") or new_completion_id(), "completion id")
    if row.get("status") not in COMPLETION_STATUSES:
        raise ValueError(f"status must be one of {COMPLETION_STATUSES}, got {row.get('status')!r}")
    return sid, completion_id


class _LoopWaker:
    """Settles one event loop's futures from the committer thread, waking the loop once per batch: each
    wake-up is a write to the loop's self-pipe and a GIL hand-off, which one per row made a measurable cost.
    A loop already closed, or a caller that gave up, has nobody to wake."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._ready: list[asyncio.Future] = []

    def settle(self, landed: asyncio.Future) -> None:
        with self._lock:
            first = not self._ready
            self._ready.append(landed)
        if first:
            with suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for landed in ready:
            if not landed.done():
                landed.set_result(None)


def _new_row(sid: str) -> dict:
    return {**empty_row(SESSIONS), "session_id": sid, "status": "open",
            "completions": 0, "prompt_tokens": 0, "completion_tokens": 0}


class StoreWriter:
    """Append-only writer for one store (a directory, created with its layout when missing, or an object
    store URL: see store/location.py and store/commit_log.py for what changes there)."""

    def __init__(self, root: StorePath | str, max_sessions: int = MAX_SESSIONS,
                 segment_bytes: int = SEGMENT_BYTES, retire_after: float = GRACE_SECONDS) -> None:
        self.root = store_path(root)
        self.max_sessions = max_sessions
        self._lock = threading.Lock()  # guards `_sessions`; never held across disk I/O
        self._loading = threading.Lock()  # one session load at a time, so none is loaded twice
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently used first
        self._closed = False
        self._owner = self._open_store()
        self._log = CommitLog(self.root / LOG_DIR, secrets.token_hex(8), segment_bytes)
        self._segments_lock = threading.Lock()
        self._wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker] = weakref.WeakKeyDictionary()
        self._uncovered: dict[StorePath, dict[str, int]] = {}  # retired segment -> {session: highest seq} not in parts
        self._flusher = Flusher(self._save_deferred, delay=SESSION_SAVE_DELAY)
        self._retirement = Retirement(retire_after)  # superseded files outlive reads that listed them
        self._recover()
        self._reconcile()
        self._local = not isinstance(self.root, ObjectPath)  # one writer: no other process adds sessions

    @property
    def cached_sessions(self) -> int:
        """How many session states are in memory now."""
        return len(self._sessions)

    def _open_store(self) -> IO[str] | None:
        for table in (None, *TABLE_DEPTH):  # the Delta tables are made by their first commit
            ensure_dir(self.root / table if table else self.root)
        version = read_version(self.root)
        if version is None:
            write_text_atomic(self.root / VERSION_FILE, f"{SCHEMA_VERSION}\n")
        elif version < SCHEMA_VERSION:
            raise outdated(self.root, version)
        if isinstance(self.root, ObjectPath):
            return None  # gateways on several machines share an object store, each with its own log
        owner = open(self.root / ".writer.lock", "a")
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner.close()
            raise StoreError(f"store {self.root} is already open in another StoreWriter") from None
        return owner

    def _recover(self) -> None:
        """Move the rows a dead writer's log holds into parts and drop its segments (a torn tail is
        no row); rows past a gap, which a correct writer never leaves, stay visible in the log."""
        logged = sorted(logged_sessions(self.root))
        for sid in logged:  # before any call is served: what recovery supersedes goes at once
            compaction.compact_session(self.root, sid)
        self._drop_covered(logged, compaction.remove_now)

    def _drop_covered(self, compacted: Collection[str], remover: compaction.Remover | None = None) -> None:
        """Delete the retired log segments whose every row is in a part file (through `remover`, by
        default after the grace period). A segment seen retired for the first time has all its sessions
        checked; after that, only the `compacted` ones. With no cached session left to compact, the live
        segment is retired first: its rows are in parts, and it would otherwise stay until it filled up."""
        if not self._closed and self._all_compacted():
            self._log.retire_live()
        with self._segments_lock:
            fresh = {path: segment_sessions(path) for path in log_segments(self.root)
                     if path not in self._uncovered and self._log.retired(path) and not self._retirement.waiting(path)}
            for sessions in fresh.values():
                self._forget_covered(sessions, list(sessions))
            for sessions in self._uncovered.values():
                self._forget_covered(sessions, [sid for sid in compacted if sid in sessions])
            self._uncovered.update(fresh)
            dropped = [path for path, sessions in self._uncovered.items() if not sessions]
            for path in dropped:
                del self._uncovered[path]
            if dropped:
                (remover or self._retirement.later)(dropped, self.root / LOG_DIR)

    def _all_compacted(self) -> bool:
        """Whether every row this writer logged is in parts (sessions dropped from the cache were compacted)."""
        with self._lock:
            states = list(self._sessions.values())
        return not any(state.dirty or state.in_flight is not None for state in states)

    def _forget_covered(self, sessions: dict[str, int], check: list[str]) -> None:
        """Remove from `sessions` ({session: highest seq in a segment}) those of `check` parts now cover."""
        for sid in check:
            if sessions[sid] < visible(session_dir(self.root, "completions", sid)).covered:
                del sessions[sid]

    def _reconcile(self) -> None:
        """Rewrite the summary rows a crash left behind their completions (a kill -9 between a call's
        durable write and its deferred row save), so readers need not wait for the session's next call.
        Costs one listing and one row read per session; only stale rows are recounted."""
        for directory in partitions(self.root, "completions"):
            sid = session_of(directory)[1]
            if self._saved_count(sid) != compaction.next_seq(directory):
                self._save(self._load(sid))  # recounts it; not cached (at most max_sessions are)

    def _saved_count(self, sid: str) -> int | None:
        """How many calls the session row on disk counts (None without a row)."""
        path = session_file(self.root, sid)
        if not exists(path):
            return None
        return read_parquet([path], SESSIONS, ["completions"]).column("completions")[0].as_py()

    def flush(self) -> None:
        """Wait until every session row reflects every recorded call."""
        self._flusher.flush()

    def close(self) -> None:
        """Write pending session rows and release the store (sessions stay open, nothing is lost)."""
        self._flusher.close()
        self._log.close()
        self.compact_idle(0.0)  # a store at rest holds each call once: in parts, not also in the log
        self._retirement.close()
        self._closed = True
        if self._owner is not None:
            self._owner.close()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def record_completion(self, row: dict) -> dict:
        """Durably record one call; fills seq, completion_id (if missing) and finished_at.

        `row` holds completions columns (missing ones are null); returns the full stored row.
        """
        sid, completion_id = _checked(row)
        with self._locked(sid) as state:
            flight = self._begin(state, row, completion_id, None)
        return flight.result()

    async def record_completion_async(self, row: dict, alone: bool = False) -> dict:
        """record_completion for a caller on an event loop. When the session's state is at hand without
        waiting (cached, unlocked, no line of it in flight), the row is encoded and queued right here
        and the loop is woken once its batch is durable: no worker thread per call. A session not in
        memory is loaded in a worker thread first; a busy one is recorded in a worker thread.

        `alone`: the caller serves no other call now. Then, on a local store with the log idle, the line
        is written and synced right here: the loop waits out the fdatasync itself, but a lone call skips
        the two thread hand-offs. Busy callers leave it to the committer, whose sync overlaps their work."""
        sid, completion_id = _checked(row)
        state, in_memory = self._ready(sid)
        if not in_memory:
            if not self._start_new(sid):
                await asyncio.to_thread(self._state, sid)  # loads it (the disk may be an object store)
            state, in_memory = self._ready(sid)
        if state is None:
            return await asyncio.to_thread(self.record_completion, row)
        loop = asyncio.get_running_loop()
        landed = loop.create_future()
        waker = self._wakers.get(loop) or self._wakers.setdefault(loop, _LoopWaker(loop))
        inline = alone and self._local
        try:
            flight = self._begin(state, row, completion_id, functools.partial(waker.settle, landed), wake=not inline)
        finally:
            state.lock.release()
        if inline:
            self._log.write_now()  # else the committer was woken to write it
        if not flight.settled.is_set():
            await landed
        return flight.result()

    def _begin(self, state: _Session, row: dict, completion_id: str,
               notify: Callable[[], None] | None, wake: bool = True) -> _InFlight:
        """Encode the row as the session's next seq and queue its line (the session's lock is held).
        Until the line lands the session has it in flight: its next line waits, so a failed write
        gives its seq again and never leaves a gap."""
        full = {**empty_row(COMPLETIONS), **row, "session_id": state.row["session_id"], "seq": state.next_seq,
                "completion_id": completion_id}
        full["finished_at"] = full["finished_at"] or datetime.now(UTC)
        flight = _InFlight(full, notify)
        try:
            self._log.submit(encode_row(state.history, full), functools.partial(self._landed, state, flight), wake)
        except BaseException:
            state.history = History()  # it learned a call that is not on disk
            raise
        state.next_seq += 1
        state.in_flight = flight
        return flight

    def _landed(self, state: _Session, flight: _InFlight, error: Exception | None) -> None:
        """The committer's word on a line: count it in the summary, or take its seq back. Its caller is
        told whatever happens here (the summary is derived data; a caller left waiting would hang)."""
        try:
            with state.lock:
                state.in_flight = None
                if error is None:
                    _apply(state, flight.row)
                    state.version += 1
                    state.last_write, state.dirty = time.monotonic(), True
                else:
                    state.history, state.next_seq = History(), flight.row["seq"]
            if error is None:
                self._flusher.submit(state.row["session_id"])
        finally:
            flight.land(error)

    def _ready(self, sid: str) -> tuple[_Session | None, bool]:
        """(the session's state with its lock taken, when that needs no waiting, else None; False when
        the session is surely not in memory). Never blocks: the caller is an event loop."""
        if not self._lock.acquire(blocking=False):
            return None, True
        try:
            state = None if self._closed else self._sessions.get(sid)
            if state is None:
                return None, self._closed  # a closed writer is left to record_completion to refuse
            self._sessions.move_to_end(sid)
        finally:
            self._lock.release()
        if not state.lock.acquire(blocking=False):
            return None, True
        if state.evicted or state.in_flight is not None:
            state.lock.release()
            return None, True
        return state, True

    def _start_new(self, sid: str) -> bool:
        """Put a session the store surely lacks in memory, right here on the event loop: no worker thread
        and no wait behind other loads for a new session's first call (under a burst of new sessions
        those waits were most of its latency). Surely lacks: a local store (this writer holds its lock)
        with no file of the session. Its log rows need no look: recovery gave every session it found in
        the log a directory, and what this writer logged for a session it dropped is in part files first.
        Costs a few stats; False leaves it to `_state`, also when the cache is full (evicting is no work
        for the loop) or another load is running."""
        if not self._local or not self._loading.acquire(blocking=False):
            return False
        try:
            directory, path = session_dir(self.root, "completions", sid), session_file(self.root, sid)
            with self._lock:
                room = not self._closed and sid not in self._sessions and len(self._sessions) < self.max_sessions
            if not room or exists(path) or is_dir(directory):
                return False
            self._add(sid, _Session(directory, path, _new_row(sid), 0))
            return True
        finally:
            self._loading.release()

    def has_session(self, sid: str) -> bool:
        """Whether the store knows the session: a recorded call (in the log or in its files), a
        registration, or a call or refusal counted under it."""
        with self._lock:
            state = self._sessions.get(validate_session_id(sid))
        if state is not None or exists(session_file(self.root, sid)):
            return True
        return compaction.next_seq(session_dir(self.root, "completions", sid)) > 0

    def note_unrecorded(self, sid: str, kind: str) -> None:
        """Count a call answered without a completion row (a probe, a model list, a token count, an
        error), so a session shows everything it sent; saved with the summary row, shortly after."""
        if kind not in UNRECORDED_KINDS:
            raise ValueError(f"unrecorded kind must be one of {UNRECORDED_KINDS}, got {kind!r}")
        with self._locked(validate_session_id(sid)) as state:
            state.unrecorded[kind] = state.unrecorded.get(kind, 0) + 1
            state.version += 1
        self._flusher.submit(sid)

    def note_refused(self, sid: str, host: str) -> None:
        """Count a connection the proxy refused (a host that is not a model API), so a session shows
        what its harness tried to reach; saved with the summary row, shortly after."""
        if not (0 < len(host) <= MAX_HOST and host.isprintable()):
            raise ValueError(f"a refused host must be printable text of 1 to {MAX_HOST} characters")
        with self._locked(validate_session_id(sid)) as state:
            if host not in state.refused and len(state.refused) >= MAX_REFUSED_HOSTS:
                host = OTHER_HOSTS  # the row stays small however many hosts a harness tries
            state.refused[host] = state.refused.get(host, 0) + 1
            state.version += 1
        self._flusher.submit(sid)

    def register_session(self, sid: str, task_id: str | None = None, harness: str | None = None,
                         metadata: dict | None = None) -> dict:
        """Create or annotate a session row; task_id and harness keep the first non-empty value."""
        with self._locked(validate_session_id(sid)) as state:
            row = state.row
            row["task_id"] = row["task_id"] or task_id
            row["harness"] = row["harness"] or harness
            if metadata:
                row["metadata_json"] = json.dumps({**json.loads(row["metadata_json"] or "{}"), **metadata})
            state.version += 1
        return self._save(state)

    def close_session(self, sid: str) -> dict:
        """Compact the session's files and mark it closed; returns the session row."""
        with self._locked(validate_session_id(sid)) as state:
            compaction.compact_dir(state.directory, self._retirement.later)
            state.row.update(status="closed", ended_at=datetime.now(UTC))
            state.version += 1
            state.dirty = False
        self._drop_covered([sid])
        return self._save(state)

    def compact_idle(self, idle_seconds: float) -> list[str]:
        """Compact sessions with new files and no write for `idle_seconds`; returns their ids."""
        with self._lock:
            states = list(self._sessions.items())
        done = []
        for sid, state in states:
            with state.lock:
                idle = time.monotonic() - state.last_write >= idle_seconds
                if state.dirty and idle and state.in_flight is None:
                    compaction.compact_dir(state.directory, self._retirement.later)
                    state.dirty = False
                    done.append(sid)
        if done:
            self._drop_covered(done)
        return done

    @contextmanager
    def _locked(self, sid: str) -> Iterator[_Session]:
        """The session's state with its lock held and no line of it in flight (fetched again if it
        was dropped meanwhile)."""
        while True:
            state = self._state(sid)
            with state.lock:
                flight = state.in_flight
                if flight is None and not state.evicted:
                    yield state
                    return
            if flight is not None:
                flight.settled.wait()

    def _state(self, sid: str) -> _Session:
        """The session's state, loaded when it is not in memory; callers check `evicted`, as another
        thread may drop it as soon as this returns."""
        state = self._cached(sid)
        if state is None:
            with self._loading:
                state = self._cached(sid)
                if state is None:
                    state = self._add(sid, self._load(sid))
        with self._lock:
            if self._sessions.get(sid) is state:
                self._sessions.move_to_end(sid)
            over = len(self._sessions) - self.max_sessions
            oldest = list(islice(self._sessions.values(), max(0, over)))
        compacted = [old.row["session_id"] for old in oldest if self._evict(old)]
        if compacted:
            self._drop_covered(compacted)
        return state

    def _cached(self, sid: str) -> _Session | None:
        with self._lock:
            if self._closed:
                raise StoreError(f"the writer of {self.root} is closed")
            return self._sessions.get(sid)

    def _add(self, sid: str, state: _Session) -> _Session:
        """A loaded session joins the cache. The load ran without the writer lock: meanwhile the event
        loop's fast path (`_ready`) kept recording the other sessions instead of falling back to threads."""
        with self._lock:
            if self._closed:
                raise StoreError(f"the writer of {self.root} is closed")
            self._sessions[sid] = state
        if state.version:  # recounted: the row on disk was stale
            self._flusher.submit(sid)
        return state

    def _evict(self, state: _Session) -> bool:
        """Drop one session's state once its files are compacted and its row is on disk; a busy
        state (locked, or with a row still to save) stays for a later pass. Whether it compacted."""
        if not state.lock.acquire(blocking=False):
            return False
        compacted = False
        try:
            if state.version != state.saved or state.in_flight is not None:
                return False
            if state.dirty:
                compaction.compact_dir(state.directory, self._retirement.later)
                state.dirty, compacted = False, True
            with self._lock:
                sid = state.row["session_id"]
                if self._sessions.get(sid) is state:
                    del self._sessions[sid]
            state.evicted = True
            return compacted
        finally:
            state.lock.release()

    def _load(self, sid: str) -> _Session:
        """Session state from disk; the summary is recounted when a crash left it behind."""
        directory = session_dir(self.root, "completions", sid)
        path = session_file(self.root, sid)
        rows = read_parquet([path], SESSIONS).to_pylist() if exists(path) else []
        state = _Session(directory, path, rows[0] if rows else _new_row(sid), compaction.next_seq(directory))
        state.failures = json.loads(state.row["upstream_failures_json"] or "{}")
        state.unrecorded = json.loads(state.row["unrecorded_json"] or "{}")
        state.refused = json.loads(state.row["refused_hosts_json"] or "{}")
        if state.row["completions"] != state.next_seq:
            self._recount(state)
        return state

    def _recount(self, state: _Session) -> None:
        table = read_session(state.directory, _RECOUNT_COLUMNS)
        status = state.row["status"]
        state.row.update(completions=0, prompt_tokens=0, completion_tokens=0, started_at=None)
        state.failures = {}
        for completion in table.to_pylist():
            _apply(state, completion)
        state.row["status"] = status
        state.version += 1

    def _save_deferred(self, sid: str) -> None:
        with self._lock:
            state = self._sessions.get(sid)
        if state is not None:  # else it was dropped, which needs its row saved first
            self._save(state)

    def _save(self, state: _Session) -> dict:
        """Write the session row if it changed since the last write; returns the row."""
        with state.lock:
            row, version = state.snapshot(), state.version
        with state.save_lock:
            if version > state.saved:
                write_parquet_atomic(state.path, rows_to_table("sessions", [row]))
                state.saved = version
        return row
