"""Which writer may append to a session now: claims and heartbeats, in create-only files every writer reads.

Seqs are assigned in the memory of the one writer that owns a session, so two writers must never append to
one session at once: a session's ownership is a chain of create-only files, `owners/<sid>/<n>.json`, each
naming a writer and whether it claims or releases the session. The highest `n` says who owns it now. To
claim, a writer creates the next `n` (a local hard link or an S3 conditional PUT: of racing writers exactly
one gets it, store/location.py `write_new`); it may when the chain is empty (the session is new to the
store: nothing to load), when the last entry is a release, or when the owner is dead. A writer is alive
while it rewrites its heartbeat, `writers/<writer-id>.json`, which says how long it may stay silent (its
`dead_after`: writers with different settings agree on who is dead) and which it rewrites several times in
that span; one whose beat is older is dead, and whoever finds it so takes its sessions over
(store/writer.py). A release deletes the entries before it: the chain of a session at rest is one file.

Every write is durable before the writer answers anything that depends on it: a claim lost in a machine
crash would let another writer start the session again at seq 0 beside the dead one's logged calls.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import time
from dataclasses import dataclass

from tracetap.store.files import StoreError, write_text_atomic
from tracetap.store.location import StorePath, list_names, read_bytes, remove, write_new
from tracetap.store.paths import validate_name, validate_session_id

OWNERS_DIR, WRITERS_DIR = "owners", "writers"
HEARTBEAT_SECONDS = 5.0  # how often a live writer rewrites its heartbeat, at most
BEATS_PER_SPAN = 4  # and at least this often within its dead_after
DEAD_AFTER = 60.0  # seconds without a heartbeat after which a writer counts as dead (clocks of machines
# sharing a bucket must agree to well within this: the beat holds its writer's wall-clock time)
CLAIM_ATTEMPTS = 20  # a claim racing other writers' reads the chain again this many times at most


class SessionOwned(Exception):
    """A call for a session another live writer owns: the caller is refused (HTTP 409) and nothing is kept."""

    def __init__(self, session_id: str, owner: str) -> None:
        super().__init__(f"session {session_id} is being recorded by another gateway ({owner}); send its calls "
                         "there, or close it first")
        self.session_id, self.owner = session_id, owner


@dataclass(frozen=True)
class Entry:
    """One link of a session's ownership chain."""

    number: int
    writer: str
    released: bool


def _chain_dir(root: StorePath, sid: str) -> StorePath:
    return root / OWNERS_DIR / validate_session_id(sid)


def _heartbeat_path(root: StorePath, writer: str) -> StorePath:
    return root / WRITERS_DIR / f"{validate_name(writer, 'writer id')}.json"


def _numbers(root: StorePath, sid: str) -> list[int]:
    """The numbers of the session's chain entries, ascending (none when no writer ever claimed it)."""
    try:
        names = list_names(_chain_dir(root, sid))
    except FileNotFoundError:
        return []
    return sorted(int(name.removesuffix(".json")) for name in names if name.removesuffix(".json").isdigit())


def last_entry(root: StorePath, sid: str) -> Entry | None:
    """The session's newest ownership entry; None when no writer ever claimed it."""
    for _ in range(CLAIM_ATTEMPTS):
        numbers = _numbers(root, sid)
        if not numbers:
            return None
        try:
            data = json.loads(read_bytes(_chain_dir(root, sid) / f"{numbers[-1]:09d}.json"))
        except FileNotFoundError:
            continue  # pruned since the listing: a newer entry exists
        return Entry(numbers[-1], data["writer"], data["released"])
    raise StoreError(f"the ownership chain of session {sid} in {root} keeps changing")


def _append(root: StorePath, sid: str, number: int, writer: str, released: bool) -> bool:
    data = json.dumps({"writer": writer, "released": released, "at": time.time()}).encode()
    return write_new(_chain_dir(root, sid) / f"{number:09d}.json", data)


def claim(root: StorePath, sid: str, writer: str) -> bool:
    """Make `writer` the session's owner; True when the session is new to the store (no writer ever had it),
    False when it was this writer's already or released or its owner dead. Raises SessionOwned when a live
    writer owns it."""
    for _ in range(CLAIM_ATTEMPTS):
        last = last_entry(root, sid)
        if last is None:
            if _append(root, sid, 0, writer, released=False):
                return True
            continue
        if last.writer == writer and not last.released:
            return False
        if not last.released and alive(root, last.writer):
            raise SessionOwned(sid, last.writer)
        if _append(root, sid, last.number + 1, writer, released=False):
            return False
    raise SessionOwned(sid, "writers racing for it")


def release(root: StorePath, sid: str, writer: str) -> None:
    """End `writer`'s ownership of the session (nothing when it does not own it), and delete the entries
    before the release: only the newest one says anything, so a store at rest keeps one per session."""
    last = last_entry(root, sid)
    if last is not None and last.writer == writer and not last.released:
        if _append(root, sid, last.number + 1, writer, released=True):
            for number in _numbers(root, sid):
                if number <= last.number:
                    remove(_chain_dir(root, sid) / f"{number:09d}.json")


def adopt(root: StorePath, sid: str, writer: str) -> None:
    """Start the chain of a session the store holds from before claims (a migrated one) with a release, so
    the first writer to claim it loads it."""
    if last_entry(root, sid) is None:
        _append(root, sid, 0, writer, released=True)


def take(root: StorePath, sid: str, dead: str, taker: str) -> bool:
    """Claim a session from the dead writer `dead` for `taker`: False when `dead` does not own it (it released
    it, or another writer claimed it meanwhile)."""
    last = last_entry(root, sid)
    if last is None or last.writer != dead or last.released:
        return False
    return _append(root, sid, last.number + 1, taker, released=False)


def heartbeat_writers(root: StorePath) -> list[str]:
    """The writers with a heartbeat file (alive or not)."""
    try:
        names = list_names(root / WRITERS_DIR)
    except FileNotFoundError:
        return []
    return [name.removesuffix(".json") for name in names if name.endswith(".json") and not name.startswith(".")]


def beat_period(dead_after: float) -> float:
    """How often a writer that may stay silent `dead_after` seconds beats."""
    return min(HEARTBEAT_SECONDS, dead_after / BEATS_PER_SPAN)


def beat(root: StorePath, writer: str, dead_after: float = DEAD_AFTER) -> None:
    """Say `writer` (this process) is alive now, and dead once `dead_after` seconds pass without another beat."""
    data = {"writer": writer, "at": time.time(), "dead_after": dead_after, "host": _host(), "pid": os.getpid()}
    write_text_atomic(_heartbeat_path(root, writer), json.dumps(data))


def _heartbeat(root: StorePath, writer: str) -> dict | None:
    try:
        return json.loads(read_bytes(_heartbeat_path(root, writer)))
    except FileNotFoundError:
        return None


def last_beat(root: StorePath, writer: str) -> float | None:
    """When `writer` last said it was alive (Unix time); None when it never did or stopped cleanly."""
    data = _heartbeat(root, writer)
    return None if data is None else float(data["at"])


def alive(root: StorePath, writer: str) -> bool:
    """Whether `writer` beat within the span its heartbeat gives, and, on this machine, its process runs: a
    gateway restarted after a crash takes over its dead predecessor at once, not `dead_after` later."""
    data = _heartbeat(root, writer)
    if data is None or time.time() - float(data["at"]) >= float(data.get("dead_after", DEAD_AFTER)):
        return False
    return data.get("host") != _host() or _running(int(data.get("pid", 0)))


@functools.cache
def _host() -> str:
    """This machine and process-id namespace: where a writer's pid means the same process (containers sharing
    a host name have their own pids)."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{socket.gethostname()}/{namespace}"


def _running(pid: int) -> bool:
    if pid <= 0:
        return True  # no pid to check: the heartbeat's age decides
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def stop_beating(root: StorePath, writer: str) -> None:
    """A writer that stops cleanly removes its heartbeat: it owns nothing any more."""
    remove(_heartbeat_path(root, writer))
