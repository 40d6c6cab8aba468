"""Readers against a store that a writer appends to and compacts continuously (store/reading.py).

Every read must succeed and show each completion once: all rows acknowledged before the read started,
none that no call wrote (a call under way may or may not show), no row twice. The writer deletes what
compaction supersedes a grace period later, as the gateway's does (store/retirement.py); the Python
readers also run against one that deletes at once, the worst case their retry must absorb (a SQL
statement opens every listed file, so there it could lose the race on every attempt).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from store_rows import completion, record_files
from tracetap.builders.runner import build, load_session
from tracetap.store import StoreReader, StoreWriter, connect, scan
from tracetap.store.compaction import next_seq
from tracetap.store.log_reading import log_rows
from tracetap.store.paths import log_segments, session_dir
from tracetap.store.reading import retrying
from tracetap.store.retirement import GRACE_SECONDS
from tracetap.store.snapshot import session_files

SESSIONS = [f"r{i}" for i in range(4)]
BATCH = 12  # completions per session between two compactions
READS = 15
SEGMENT_BYTES = 8192  # small log segments: compaction deletes some under every reader

Key = tuple[str, int]


class Churn:
    """A writer thread: append BATCH calls to every session, compact them all, repeat until stopped.
    Its log segments rotate every few calls, so compaction also deletes segments under the readers."""

    def __init__(self, root: Path, retire_after: float = GRACE_SECONDS) -> None:
        self.writer = StoreWriter(root, segment_bytes=SEGMENT_BYTES, retire_after=retire_after)
        self.acked: list[Key] = []
        self.started: list[Key] = []  # calls under way: a reader may see them before they are acknowledged
        self.compactions = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._run, name="churn")

    def acknowledged(self) -> set[Key]:
        with self._lock:
            return set(self.acked)

    def begun(self) -> set[Key]:
        with self._lock:
            return set(self.started)

    def _round(self) -> None:
        for sid in SESSIONS:
            for _ in range(BATCH):
                with self._lock:
                    self.started.append((sid, self._calls[sid]))
                    self._calls[sid] += 1
                row = self.writer.record_completion(completion(sid))
                with self._lock:
                    self.acked.append((sid, row["seq"]))
                    assert self.started[-1] == self.acked[-1]
        self.compactions += len(self.writer.compact_idle(0.0))

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._round()
        except BaseException as error:  # reported by the test, not lost in the thread
            self.error = error

    def __enter__(self) -> Churn:
        self._round()  # every session has a part file and per-call files before the readers start
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.writer.close()
        assert self.error is None, self.error


@pytest.fixture
def churn(root: Path, request: pytest.FixtureRequest) -> Iterator[Churn]:
    """The churning writer; `DELETING` as its param: one whose compactions delete at once, under the readers."""
    with Churn(root, getattr(request, "param", GRACE_SECONDS)) as running:
        yield running


DELETING = pytest.mark.parametrize("churn", [0.0], indirect=True, ids=["deleting-at-once"])


def check_reads(churn: Churn, read: Callable[[], list[Key]], times: int = READS) -> None:
    """Run `read` `times` times during the churn; each answer must be exact for its moment."""
    for _ in range(times):
        before = churn.acknowledged()
        seen = read()
        begun = churn.begun()
        assert len(seen) == len(set(seen)), "a row was read twice"
        assert before - set(seen) == set(), "rows acknowledged before the read are missing"
        assert set(seen) - begun == set(), "rows no call wrote were read"
    assert churn.compactions > 0


def sql_keys(root: Path) -> list[Key]:
    rows = connect(root).execute("SELECT session_id, seq FROM completions").fetchall()
    return [(sid, seq) for sid, seq in rows]


def test_sql_through_the_connection_never_fails_under_compaction(root, churn):
    check_reads(churn, lambda: sql_keys(root))


def test_sql_relations_are_read_under_compaction(root, churn):
    def read() -> list[Key]:
        table = connect(root).sql("SELECT session_id, seq FROM completions").to_arrow_table()
        return list(zip(table["session_id"].to_pylist(), table["seq"].to_pylist(), strict=True))

    check_reads(churn, read)


@DELETING
def test_a_lazy_scan_lists_its_files_when_collected(root, churn):
    frame = scan(root, "completions").select("session_id", "seq")  # built once, collected many times
    check_reads(churn, lambda: list(frame.collect().iter_rows()))


def test_scan_pushes_filters_and_projections_through(root, churn):
    frame = scan(root, "completions").filter(seq=0).select("session_id", "seq")
    assert sorted(frame.collect().iter_rows()) == [(sid, 0) for sid in SESSIONS]
    assert scan(root, "completions").head(3).collect().height == 3


@DELETING
def test_builder_reads_never_fail_under_compaction(root, churn):
    def read() -> list[Key]:
        return [(sid, int(row["seq"])) for sid in SESSIONS for row in load_session(root, sid)[0]]

    check_reads(churn, read)
    for _ in range(3):
        assert build(root, "per_request").sessions == len(SESSIONS)


@DELETING
def test_the_reader_api_never_fails_under_compaction(root, churn):
    reader = StoreReader(root)

    def read() -> list[Key]:
        tables = reader.completions_of(SESSIONS, ["seq"])
        seqs = {sid: table["seq"].to_pylist() for sid, table in tables.items()}
        assert all(listed == sorted(listed) for listed in seqs.values()), "rows out of seq order"
        return [(sid, seq) for sid, listed in seqs.items() for seq in listed]

    check_reads(churn, read)


def test_a_connection_for_some_sessions_reads_them_under_compaction(root, churn):
    con = connect(root, session_ids=SESSIONS)  # every session named: the churn's checks hold as they are
    check_reads(churn, lambda: [(sid, seq) for sid, seq in
                                con.execute("SELECT session_id, seq FROM completions").fetchall()])


@DELETING
def test_listing_files_never_misses_or_repeats_rows(root, churn):
    def seqs(sid: str) -> list[int]:
        logged = log_rows(root, sid, ["seq"]).column("seq").to_pylist()  # first, as readers do
        listed = session_files(session_dir(root, "completions", sid))
        return _seqs(listed.files) + [seq for seq in logged if seq >= listed.covered]

    def read() -> list[Key]:
        return [(sid, seq) for sid in SESSIONS for seq in retrying(lambda sid=sid: seqs(sid))]

    check_reads(churn, read, times=200)


def _seqs(files: tuple[str, ...]) -> list[int]:
    """The seqs a listing shows, from file names: part-N holds 0..N-1, the rest one seq each."""
    out: list[int] = []
    for path in map(Path, files):
        out += list(range(int(path.stem.removeprefix("part-")))) if path.name.startswith("part-") else [
            int(path.name[:8])]
    return out


def test_the_sql_command_never_fails_under_compaction(root, churn):
    def read() -> list[Key]:
        done = subprocess.run([sys.executable, "-m", "tracetap.cli", "sql", "--store", str(root), "--json",
                               "SELECT session_id, seq FROM completions"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return [(row["session_id"], row["seq"]) for row in json.loads(done.stdout)]

    check_reads(churn, read, times=4)


def test_a_hole_in_the_store_itself_is_read_as_it_is(root, writer):
    record_files(root, 3, "h")
    directory = session_dir(root, "completions", "h")
    next(directory.glob("00000001-*.parquet")).unlink()
    assert [path.name[:8] for path in map(Path, session_files(directory).files)] == ["00000000", "00000002"]
    assert connect(root).execute("SELECT count(*) FROM completions").fetchone() == (2,)


def test_a_log_segment_deleted_after_it_was_listed_hides_no_session(tmp_path, monkeypatch):
    """A reader listed the log, then compaction moved a segment's rows into a part and deleted it before
    the reader opened it: the session is still listed (from its part), its next seq still follows its
    rows, and nothing raises."""
    root = tmp_path / "store"
    with StoreWriter(root, segment_bytes=1, retire_after=0.0) as writer:
        writer.record_completion(completion("s0"))
        writer.record_completion(completion("s1"))  # past segment_bytes: s0's segment is retired
        listed = log_segments(root)
        writer.compact_idle(0.0)
        gone = [path for path in listed if not path.exists()]
        assert gone, "compaction deleted no segment: the test no longer sets up the race"
        monkeypatch.setattr("tracetap.store.log_reading.log_segments", lambda _root: listed)
        reader = StoreReader(root)
        assert reader.session_ids() == ["s0", "s1"]
        assert reader.recorded("s0") and reader.recorded("s1")
        assert next_seq(session_dir(root, "completions", "s0")) == 1
