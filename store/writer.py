"""The durable, thread-safe writer the gateway records every call with.

Every completion is one line of the writer's group-commit log (store/commit_log.py): calls that finish
together share one append and one fdatasync, and `record_completion` returns once its line is durable. The
line holds the row's compact form (store/compact_form.py: only what is new since the session's earlier
calls); each cached session keeps the encoder's History (at most 1 MiB of chain tips, 128 KiB of chunk keys
twice: in order and sorted, and the 4 latest bodies of each kind, 1 MiB of text per kind, with 25 B a chunk
of where their chunks are and their keys; a session dropped from the cache starts a fresh one).

The compactor (a background thread) moves logged calls into the `completions` Delta table, many sessions a
commit (store/compaction.py), with those sessions' rows into `sessions`: on close_session, compact_idle,
eviction and the writer's close, so a store at rest holds each call once. Its table work runs in
store/committer.py's worker process when the writer is `isolated` (the gateway's), in its own threads else. A
log segment whose every row the table holds is deleted at once (readers read the log before the table:
store/reading.py), the live one too once every session is committed. A session's row changes with each call;
until its next commit the writer keeps it in its live file (store/live_sessions.py), rewritten by a background
thread shortly after each change and synchronously by register_session, close_session, flush and close. A
writer opening the store recovers what a dead one left: its logged rows are committed, torn tails dropped, and
the rows of its sessions recounted and committed. Session state lives in memory after its first touch, so a
write never re-reads the store. Writes to one session are serialized: a session has at most one line in flight
(seqs hit the disk in order, which compaction relies on, and a failed write gives its seq back without a gap);
different sessions write in parallel. The gateway records from its event loop (`record_completion_async`): the
row is encoded there and the committer wakes the loop when it is durable, so no thread waits per call. One
writer process per local store: a lock file enforces it.

On an object store (`s3://bucket/prefix`, store/location.py) the log is one object per batch
(store/commit_log.py) and the tables commit by conditional PUT, so gateways on several machines can share
one store: there is no writer lock, each gateway records its own sessions (a session's seqs are assigned
in one writer's memory, so one session must go through one gateway at a time), and one opening the store
commits every logged row it finds (a compaction racing the row's own writer commits it once: see
store/compaction.py).

Memory stays bounded however many sessions a long-lived gateway sees: past `max_sessions` cached states,
the least recently used committed ones are dropped, and those with uncommitted calls handed to the
compactor first (a later call to such a session loads it again from the store, exactly as after a restart).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice

from tracetap.store import committer, owners
from tracetap.store.background import BackgroundThread
from tracetap.store.commit_log import SEGMENT_BYTES, CommitLog
from tracetap.store.committer import Committer, StoredSession
from tracetap.store.compact_form import History, encode_row
from tracetap.store.compaction import compact_sessions
from tracetap.store.delta import check_supported
from tracetap.store.files import StoreError, outdated, read_version, write_text_atomic
from tracetap.store.flusher import Flusher
from tracetap.store.live_sessions import write_live
from tracetap.store.location import ObjectPath, StorePath, ensure_dir, store_path
from tracetap.store.paths import LOG_DIR, VERSION_FILE, log_segments, segment_writer, validate_name, validate_session_id
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

log = logging.getLogger(__name__)
FAILED = ("upstream_error", "timeout", "aborted", "disconnected")
SESSION_SAVE_DELAY = 0.5  # seconds calls wait to share one rewrite of the live session rows (derived data,
# recounted on open; at 0.05 s a busy gateway rewrote ~1 row per call, ~0.7 ms CPU each)
RECOVERY_BATCH = 256  # sessions a recovery commits at once
LIVE = "live"  # the live flusher's one key: each save rewrites the whole live file
TAKEOVER = "takeover"  # the takeover thread's one key: each pass looks for every dead writer
FENCE_AT = 0.8  # a writer silent for this part of its dead_after stops recording (store/owners.py)
MAX_SESSIONS = 1024  # session states kept in memory (a few KB each); older idle ones are dropped
MAX_HOST = 255  # a DNS name is at most 253 characters; a refused host longer than this is not one


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

    row: dict
    next_seq: int
    committed: int = 0  # calls the completions table holds (seqs 0..committed-1)
    failures: dict = field(default_factory=dict)
    unrecorded: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)  # host -> refusals (proxy mode)
    last_write: float = 0.0
    version: int = 0  # the row's revision: bumped on every change of the summary
    committed_version: int = -1  # the revision the sessions table holds (-1: none)
    evicted: bool = False  # dropped from the cache: whoever holds this state must fetch a fresh one
    history: History = field(default_factory=History)  # what the compact encoder can refer to
    in_flight: _InFlight | None = None  # the line queued in the log and not yet durable (at most one)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> dict:
        return {**self.row, "upstream_failures_json": _json_or_none(self.failures), "revision": self.version,
                "unrecorded_json": _json_or_none(self.unrecorded), "refused_hosts_json": _json_or_none(self.refused)}

    def settled(self) -> bool:
        """Whether the tables hold all of it: every call and the row as it is now (nothing in flight)."""
        return (self.in_flight is None and self.committed >= self.next_seq
                and self.committed_version >= self.version)


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


def _recount(state: _Session, calls: list[dict]) -> None:
    """Count the summary again from the session's calls (its status stays)."""
    status = state.row["status"]
    state.row.update(completions=0, prompt_tokens=0, completion_tokens=0, started_at=None)
    state.failures = {}
    for completion in calls:
        _apply(state, completion)
    state.row["status"] = status
    state.version += 1


def _checked(row: dict) -> tuple[str, str]:
    """The row's session id and completion id (made when missing), both checked, and its status."""
    sid = validate_session_id(row.get("session_id"))
    completion_id = validate_name(row.get("completion_id") or new_completion_id(), "completion id")
    if row.get("status") not in COMPLETION_STATUSES:
        raise ValueError(f"status must be one of {COMPLETION_STATUSES}, got {row.get('status')!r}")
    return sid, completion_id


class _Heartbeat(BackgroundThread):
    """Runs `beat` every `period` seconds until closed; a failed beat is logged and the next one retries."""

    def __init__(self, beat: Callable[[], None], period: float) -> None:
        super().__init__("tracetap-heartbeat")
        self._beat, self._period = beat, period
        with self._cond:
            self._start()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._cond.wait_for(lambda: self._closed, timeout=self._period):
                    return
            try:
                self._beat()
            except Exception:
                log.exception("heartbeat failed")


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
                 segment_bytes: int = SEGMENT_BYTES, isolated: bool = False,
                 dead_after: float = owners.DEAD_AFTER) -> None:
        """`isolated`: run the table work in a worker process (store/committer.py), as a gateway does.
        `dead_after`: seconds without a heartbeat after which other writers count this one as dead, so take over
        its sessions (store/owners.py)."""
        self.root = store_path(root)
        self.max_sessions = max_sessions
        self._lock = threading.Lock()  # guards `_sessions`; never held across disk I/O
        self._loading = threading.Lock()  # one session load at a time, so none is loaded twice
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently used first
        self._closed = False
        self._fenced = False  # silent too long, perhaps taken over by another writer: see _beat
        self._prepare_store()
        self._tables = Committer(isolated)
        self._log = CommitLog(self.root / LOG_DIR, secrets.token_hex(8), segment_bytes)
        self.writer_id, self.dead_after = self._log.writer_id, dead_after
        self.writer = f"tracetap gateway {self._log.writer_id}"  # names its commits (`tracetap history`)
        self._wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker] = weakref.WeakKeyDictionary()
        self._flusher: Flusher[str] = Flusher(self._save_live, delay=SESSION_SAVE_DELAY)
        self._compactor: Flusher[str] = Flusher(self._compact, name="tracetap-compactor")
        self._local = not isinstance(self.root, ObjectPath)
        self._start_beating()  # before its first claim or log line
        self._take_over_dead()

    def _start_beating(self) -> None:
        """The first heartbeat, and the threads that beat and take over dead writers: apart, so a long takeover
        never delays a beat (a writer silent past its dead_after is taken over itself)."""
        owners.beat(self.root, self.writer_id, self.dead_after)
        self._last_beat = time.monotonic()
        self._takeovers: Flusher[str] = Flusher(lambda _: self._take_over_dead(), name="tracetap-takeover")
        self._heartbeat = _Heartbeat(self._beat, owners.beat_period(self.dead_after))

    @property
    def cached_sessions(self) -> int:
        """How many session states are in memory now."""
        return len(self._sessions)

    def _prepare_store(self) -> None:
        check_supported(self.root)  # before a call is taken that could never be committed
        ensure_dir(self.root)
        version = read_version(self.root)
        if version is None:
            write_text_atomic(self.root / VERSION_FILE, f"{SCHEMA_VERSION}\n")
        elif version < SCHEMA_VERSION:
            raise outdated(self.root, version)

    def _beat(self) -> None:
        """The heartbeat's work: say this writer is alive, then have dead writers looked for. A writer silent
        for most of its `dead_after` (stalled), or whose heartbeat is gone (another writer found it dead and
        took it over), may have lost its sessions to other writers: it records nothing more."""
        if self._fenced:
            return
        if self._silent_too_long() or owners.last_beat(self.root, self.writer_id) is None:
            self._fenced = True
            log.error("writer %s of %s was silent too long, so may have been taken over by another writer: it "
                      "records nothing more", self.writer_id, self.root)
            return
        owners.beat(self.root, self.writer_id, self.dead_after)
        self._last_beat = time.monotonic()
        self._takeovers.submit(TAKEOVER)

    def _silent_too_long(self) -> bool:
        """Whether this writer's last beat is so old that other writers may count it dead (their clocks may
        run a little ahead: FENCE_AT)."""
        return time.monotonic() - self._last_beat >= self.dead_after * FENCE_AT

    def _take_over_dead(self) -> None:
        """Commit and end what dead writers left (store/owners.py says who is dead)."""
        for dead in self._tables.run(committer.dead_writers, self.root, self.writer_id):
            self._take_over(dead)

    def _take_over(self, dead: str) -> None:
        """Commit a dead writer's logged calls; the sessions it still owned are claimed, their rows recounted
        and closed, committed and released; then its log, live file and heartbeat go."""
        sids = self._tables.run(committer.writer_sessions, self.root, dead)
        for start in range(0, len(sids), RECOVERY_BATCH):
            batch = sids[start:start + RECOVERY_BATCH]
            owned = [sid for sid in batch if owners.take(self.root, sid, dead, self.writer_id)]
            states = {sid: self._load(sid) for sid in owned}
            for state in states.values():
                state.row.update(status="closed", ended_at=state.row["ended_at"] or datetime.now(UTC))
                state.version += 1
            self._commit(states)
            self._tables.run(compact_sessions, self.root, sorted(set(batch) - set(owned)), self.writer)
            for sid in owned:
                owners.release(self.root, sid, self.writer_id)
        self._tables.run(committer.retire_writer, self.root, dead)

    def _commit(self, states: dict[str, _Session]) -> None:
        """One commit of the sessions' logged calls, then one of their rows (as they are now)."""
        rows, versions = {}, {}
        for sid, state in states.items():
            with state.lock:
                rows[sid], versions[sid] = state.snapshot(), state.version
        covered = self._tables.run(committer.commit_sessions, self.root, list(rows.values()), self.writer)
        for sid, state in states.items():
            with state.lock:
                state.committed = max(state.committed, covered.get(sid, 0))
                state.committed_version = max(state.committed_version, versions[sid])

    def _compact(self, sids: list[str]) -> None:
        """The compactor's batch: commit the cached ones of `sessions`, drop the log segments the table now
        covers, and rewrite the live file without the rows just committed."""
        with self._lock:
            states = {sid: state for sid in sids if (state := self._sessions.get(sid)) is not None}
        if not states:
            return
        self._commit(states)
        self._drop_covered()
        self._flusher.submit(LIVE)

    def _drop_covered(self) -> None:
        """Delete every log segment no batch can go to again whose rows the completions table all holds.
        With no cached session left to commit, the live segment is retired first: its rows are in the
        table, and it would otherwise stay until it filled up."""
        if not self._closed and self._all_committed():
            self._log.retire_live()
        retired = [path for path in log_segments(self.root)
                   if segment_writer(path) == self.writer_id and self._log.retired(path)]
        if retired:
            self._tables.run(committer.drop_covered, self.root, retired)

    def _all_committed(self) -> bool:
        """Whether the table holds every call this writer logged (dropped sessions were committed)."""
        with self._lock:
            states = list(self._sessions.values())
        return all(state.in_flight is None and state.committed >= state.next_seq for state in states)

    def flush(self) -> None:
        """Wait until the live session rows reflect every recorded call."""
        self._flusher.flush()

    def close(self) -> None:
        """Commit every session's calls and row and release them (they stay open, nothing is lost): a store
        at rest holds each call once, in the table, and no live rows. What could not be committed keeps its
        claim and this writer's heartbeat, which goes stale: another writer takes it over."""
        self._heartbeat.close()
        self._takeovers.close()
        self._flusher.close()
        self._log.close()
        with self._lock:
            sids = list(self._sessions)
        for sid in sids:
            self._compactor.submit(sid)
        self._compactor.close()
        self._tables.close()
        settled = [state for state in self._sessions.values() if state.settled()]
        for state in settled:
            owners.release(self.root, state.row["session_id"], self.writer_id)
        if len(settled) == len(self._sessions):
            write_live(self.root, self.writer_id, [])
            owners.stop_beating(self.root, self.writer_id)
        self._closed = True

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
            await asyncio.to_thread(self._state, sid)  # claims it, loads it when the store has it
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

    def _check_not_fenced(self) -> None:
        if self._fenced or self._silent_too_long():
            raise StoreError(f"this writer of {self.root} stalled past its dead_after and may have been taken over "
                             "by another: restart the gateway")

    async def own(self, sid: str) -> None:
        """Claim the session for this writer now, before its call is sent upstream: SessionOwned when another
        live writer records it (store/owners.py). A session in memory is this writer's already."""
        sid = validate_session_id(sid)
        self._check_not_fenced()
        with self._lock:
            if sid in self._sessions:
                return
        await asyncio.to_thread(self._state, sid)

    def _begin(self, state: _Session, row: dict, completion_id: str,
               notify: Callable[[], None] | None, wake: bool = True) -> _InFlight:
        """Encode the row as the session's next seq and queue its line (the session's lock is held).
        Until the line lands the session has it in flight: its next line waits, so a failed write
        gives its seq again and never leaves a gap."""
        self._check_not_fenced()
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
                    state.last_write = time.monotonic()
                else:
                    state.history, state.next_seq = History(), flight.row["seq"]
            if error is None:
                self._flusher.submit(LIVE)
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

    def has_session(self, sid: str) -> bool:
        """Whether the store knows the session: a recorded call (in the log or the table), a registration,
        or a call or refusal counted under it."""
        sid = validate_session_id(sid)
        with self._lock:
            if sid in self._sessions:
                return True
        return owners.last_entry(self.root, sid) is not None  # every session the store holds has a chain

    def note_unrecorded(self, sid: str, kind: str) -> None:
        """Count a call answered without a completion row (a probe, a model list, a token count, an
        error), so a session shows everything it sent; saved with the live rows, shortly after."""
        if kind not in UNRECORDED_KINDS:
            raise ValueError(f"unrecorded kind must be one of {UNRECORDED_KINDS}, got {kind!r}")
        with self._locked(validate_session_id(sid)) as state:
            state.unrecorded[kind] = state.unrecorded.get(kind, 0) + 1
            state.version += 1
        self._flusher.submit(LIVE)

    def note_refused(self, sid: str, host: str) -> None:
        """Count a connection the proxy refused (a host that is not a model API), so a session shows
        what its harness tried to reach; saved with the live rows, shortly after."""
        if not (0 < len(host) <= MAX_HOST and host.isprintable()):
            raise ValueError(f"a refused host must be printable text of 1 to {MAX_HOST} characters")
        with self._locked(validate_session_id(sid)) as state:
            if host not in state.refused and len(state.refused) >= MAX_REFUSED_HOSTS:
                host = OTHER_HOSTS  # the row stays small however many hosts a harness tries
            state.refused[host] = state.refused.get(host, 0) + 1
            state.version += 1
        self._flusher.submit(LIVE)

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
            snapshot = state.snapshot()
        self._flusher.submit(LIVE)
        self._flusher.flush()
        return snapshot

    def close_session(self, sid: str) -> dict:
        """Mark the session closed and commit its calls and row; returns the session row."""
        with self._locked(validate_session_id(sid)) as state:
            state.row.update(status="closed", ended_at=datetime.now(UTC))
            state.version += 1
            snapshot = state.snapshot()
        self._compactor.submit(sid)
        self._compactor.flush()
        with state.lock:
            if not state.settled():
                raise StoreError(f"could not commit session {sid} to {self.root} (see the log); its calls are safe "
                                 "in the log and are committed by a later compaction")
            self._drop(state)
        return snapshot

    def compact_idle(self, idle_seconds: float) -> list[str]:
        """Commit the sessions with something uncommitted and no write for `idle_seconds`; returns their ids."""
        with self._lock:
            states = list(self._sessions.items())
        now = time.monotonic()
        idle = [sid for sid, state in states if not state.settled() and now - state.last_write >= idle_seconds]
        for sid in idle:
            self._compactor.submit(sid)
        if idle:
            self._compactor.flush()
        return [sid for sid, state in states if sid in idle and state.committed >= state.next_seq]

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
            new = self._claim(sid)  # not under _loading: claims of new sessions wait on their fsyncs together
            with self._loading:
                state = self._cached(sid)
                if state is None:
                    state = self._add(sid, _Session(_new_row(sid), 0) if new else self._load(sid))
        with self._lock:
            if self._sessions.get(sid) is state:
                self._sessions.move_to_end(sid)
            over = len(self._sessions) - self.max_sessions
            oldest = list(islice(self._sessions.values(), max(0, over)))
        for old in oldest:
            self._evict(old)
        return state

    def _claim(self, sid: str) -> bool:
        """Claim the session for this writer (SessionOwned when a live one owns it); True when it is new to the
        store (no writer ever claimed it), so there is nothing to load."""
        return owners.claim(self.root, sid, self.writer_id)

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
        if state.version > state.committed_version:  # recounted: the stored row was stale
            self._flusher.submit(LIVE)
        return state

    def _evict(self, state: _Session) -> None:
        """Drop one session's state once the tables hold all of it; one with something uncommitted is handed
        to the compactor and dropped by a later pass (a busy one stays for a later pass too)."""
        if not state.lock.acquire(blocking=False):
            return
        try:
            sid = state.row["session_id"]
            if not state.settled():
                self._compactor.submit(sid)
                return
            self._drop(state)
        finally:
            state.lock.release()

    def _drop(self, state: _Session) -> None:
        """Forget a settled session (its lock held) and end this writer's claim on it: marked evicted first,
        so whoever holds the state fetches it again, which claims it again (store/owners.py)."""
        sid = state.row["session_id"]
        state.evicted = True
        owners.release(self.root, sid, self.writer_id)
        with self._lock:
            if self._sessions.get(sid) is state:
                del self._sessions[sid]

    def _load(self, sid: str) -> _Session:
        """Session state from the store; the row is recounted when a crash left it behind its calls."""
        stored: StoredSession = self._tables.run(committer.load_session, self.root, sid)
        row = dict(stored.row) if stored.row is not None else _new_row(sid)
        state = _Session(row, stored.next_seq, stored.committed)
        state.version = state.committed_version = row.pop("revision", None) or 0
        state.failures = json.loads(row["upstream_failures_json"] or "{}")
        state.unrecorded = json.loads(row["unrecorded_json"] or "{}")
        state.refused = json.loads(row["refused_hosts_json"] or "{}")
        if stored.row is None:
            state.committed_version = -1
        if stored.calls is not None:
            _recount(state, stored.calls)
        return state

    def _save_live(self, keys: list[str]) -> None:
        """Rewrite the live file: the rows of the cached sessions changed since their last commit."""
        with self._lock:
            states = list(self._sessions.values())
        rows = []
        for state in states:
            with state.lock:
                if state.version > state.committed_version:
                    rows.append(state.snapshot())
        write_live(self.root, self._log.writer_id, rows)
