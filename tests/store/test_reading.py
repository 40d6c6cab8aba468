"""Readers against a store that a writer in another process appends to and compacts continuously
(store/reading.py, store/catalog.py).

Every read must succeed and show each completion once: all rows acknowledged before the read started,
none that no call wrote (a call under way may or may not show), no row twice. Nothing is retried: a
reader reads the log first and the table's latest version after, and shows of the log only the rows past
what that version holds; the writer deletes a log segment once the table holds all its rows, so a
segment gone between the two reads had its rows in the version the reader then loads. Session rows work
the same way with the writers' live files: of a session's committed row and live rows, the highest
revision is current.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from store_rows import abandoned_writer_store, completion
from tracetap.builders.runner import build, load_session
from tracetap.store import StoreReader, StoreWriter, compact_sessions, connect, scan
from tracetap.store import catalog as catalog_module
from tracetap.store import reading as reading_module
from tracetap.store.commit_log import encode_line
from tracetap.store.delta import committed_seqs, open_table
from tracetap.store.live_sessions import write_live
from tracetap.store.log_reading import log_rows
from tracetap.store.paths import live_files, log_segments
from tracetap.store.reading import read_completions, read_sessions, stored_completions, uncommitted

SESSIONS = [f"r{i}" for i in range(4)]
BATCH = 12  # completions per session between two compactions
READS = 15
SEGMENT_BYTES = 8192  # small log segments: compaction deletes some under every reader
PAUSE = 0.2  # seconds the writer rests after a compaction: each adds a file a session, which every read lists
COMPACTIONS = 2  # compactions each concurrency test's reads must overlap at least
DEADLINE = 180.0  # seconds a concurrency test may read for

Key = tuple[str, int]

CHURN = textwrap.dedent("""
    import json, os, sys, time
    from tracetap.store import StoreWriter
    root, journal, stop, sessions, batch, segment_bytes, pause, row = sys.argv[1:9]
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def note(line):  # one write per line: the parent never reads half of one
        os.write(fd, (line + "\\n").encode())

    with StoreWriter(root, segment_bytes=int(segment_bytes)) as writer:
        while True:
            for sid in sessions.split(","):
                for _ in range(int(batch)):
                    note(f"S {sid}")
                    seq = writer.record_completion({**json.loads(row), "session_id": sid})["seq"]
                    note(f"A {sid} {seq}")
            note(f"C {len(writer.compact_idle(0.0))}")
            if os.path.exists(stop):
                break
            time.sleep(float(pause))
    note("D")
""")


class Churn:
    """A writer process (spawned: a fresh interpreter, no fork): append BATCH calls to every session, compact
    them all, repeat until told to stop, then close. Its log segments rotate every few calls, so compaction
    also deletes segments under the readers. It notes each call before it starts (S) and once acknowledged
    (A), and each compaction (C), in a journal this process reads."""

    def __init__(self, root: Path, workdir: Path) -> None:
        self.root, self.journal, self.stop = root, workdir / "journal", workdir / "stop"
        args = [root, self.journal, self.stop, ",".join(SESSIONS), BATCH, SEGMENT_BYTES, PAUSE,
                json.dumps(completion())]
        self.proc = subprocess.Popen([sys.executable, "-c", CHURN, *map(str, args)], stderr=subprocess.PIPE, text=True)

    def _lines(self) -> list[list[str]]:
        data = self.journal.read_bytes() if self.journal.exists() else b""
        return [line.split() for line in data[:data.rfind(b"\n") + 1].decode().splitlines()]

    def acknowledged(self) -> set[Key]:
        return {(sid, int(seq)) for kind, *rest in self._lines() if kind == "A" for sid, seq in [rest]}

    def begun(self) -> set[Key]:
        """Every call started so far: a session's n-th call is its seq n-1 (a fresh store, no failed write)."""
        started = Counter(rest[0] for kind, *rest in self._lines() if kind == "S")
        return {(sid, seq) for sid, count in started.items() for seq in range(count)}

    def compactions(self) -> int:
        """Compactions that committed something."""
        return sum(1 for kind, *rest in self._lines() if kind == "C" and int(rest[0]) > 0)

    def running(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"the writer process died: {self.proc.stderr.read()}")

    def __enter__(self) -> Churn:
        deadline = time.monotonic() + 60
        while self.compactions() == 0:  # every session is in the table and in the log before the readers start
            self.running()
            assert time.monotonic() < deadline, "the writer process made no compaction"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.touch()
        _, stderr = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, stderr


@pytest.fixture
def churn(root: Path, tmp_path: Path) -> Iterator[Churn]:
    with Churn(root, tmp_path) as running:
        yield running


def overlapping(churn: Churn, times: int) -> Iterator[int]:
    """Read `times` times, and on until the reads overlapped COMPACTIONS compactions."""
    first, deadline, done = churn.compactions(), time.monotonic() + DEADLINE, 0
    while done < times or churn.compactions() < first + COMPACTIONS:
        churn.running()
        assert time.monotonic() < deadline, "the reads overlapped too few compactions"
        yield done
        done += 1


def check_reads(churn: Churn, read: Callable[[], list[Key]], times: int = READS) -> None:
    """Run `read` during the churn; each answer must be exact for its moment."""
    for _ in overlapping(churn, times):
        before = churn.acknowledged()
        seen = read()
        begun = churn.begun()
        assert len(seen) == len(set(seen)), "a row was read twice"
        assert before - set(seen) == set(), "rows acknowledged before the read are missing"
        assert set(seen) - begun == set(), "rows no call wrote were read"


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


def test_one_connection_follows_the_store_statement_after_statement(root, churn):
    con = connect(root)  # each statement brings the views to the log and the table's latest version
    check_reads(churn, lambda: [(sid, seq) for sid, seq in
                                con.execute("SELECT session_id, seq FROM completions").fetchall()])


def test_a_lazy_scan_reads_the_store_when_collected(root, churn):
    frame = scan(root, "completions").select("session_id", "seq")  # built once, collected many times
    check_reads(churn, lambda: list(frame.collect().iter_rows()))


def test_scan_pushes_filters_and_projections_through(root, churn):
    frame = scan(root, "completions").filter(seq=0).select("session_id", "seq")
    assert sorted(frame.collect().iter_rows()) == [(sid, 0) for sid in SESSIONS]
    assert scan(root, "completions").head(3).collect().height == 3


def test_builder_reads_never_fail_under_compaction(root, churn):
    def read() -> list[Key]:
        return [(sid, int(row["seq"])) for sid in SESSIONS for row in load_session(root, sid)[0]]

    check_reads(churn, read)
    for _ in range(3):
        assert build(root, "per_request").sessions == len(SESSIONS)


def test_the_reader_api_never_fails_under_compaction(root, churn):
    reader = StoreReader(root)

    def read() -> list[Key]:
        tables = reader.completions_of(SESSIONS, ["seq"])
        seqs = {sid: table["seq"].to_pylist() for sid, table in tables.items()}
        assert all(listed == sorted(listed) for listed in seqs.values()), "rows out of seq order"
        assert reader.session_ids() == SESSIONS and all(reader.recorded(sid) for sid in SESSIONS)
        return [(sid, seq) for sid, listed in seqs.items() for seq in listed]

    check_reads(churn, read)


def test_a_connection_for_some_sessions_reads_them_under_compaction(root, churn):
    con = connect(root, session_ids=SESSIONS)  # every session named: the churn's checks hold as they are
    check_reads(churn, lambda: [(sid, seq) for sid, seq in
                                con.execute("SELECT session_id, seq FROM completions").fetchall()])


def test_the_log_rows_past_the_tables_version_never_miss_or_repeat_a_row(root, churn):
    def read() -> list[Key]:
        stored = stored_completions(root, None, ["seq"])
        return list(zip(stored["session_id"].to_pylist(), stored["seq"].to_pylist(), strict=True))

    check_reads(churn, read, times=100)


def test_the_sql_command_never_fails_under_compaction(root, churn):
    def read() -> list[Key]:
        done = subprocess.run([sys.executable, "-m", "tracetap.cli", "sql", "--store", str(root), "--json",
                               "SELECT session_id, seq FROM completions"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return [(row["session_id"], row["seq"]) for row in json.loads(done.stdout)]

    check_reads(churn, read, times=4)


def check_session_rows(churn: Churn, read: Callable[[], list[dict]], times: int = READS) -> None:
    """Each answer holds one row per session (each was committed before the reads began), never one older
    than an earlier answer showed (the highest revision wins), counting no call that had not begun."""
    newest: dict[str, tuple[int, int]] = {}
    for _ in overlapping(churn, times):
        rows = read()
        started = Counter(sid for sid, _ in churn.begun())
        assert sorted(row["session_id"] for row in rows) == SESSIONS
        for row in rows:
            sid, (revision, completions) = row["session_id"], newest.get(row["session_id"], (0, 0))
            assert row["revision"] >= revision and row["completions"] >= completions, (
                f"{sid}: an older row than an earlier read showed")
            assert row["completions"] <= started[sid], f"{sid}: counts calls that never began"
            newest[sid] = (row["revision"], row["completions"])
    assert all(completions >= BATCH for _, completions in newest.values())


def test_session_rows_never_go_back_under_compaction(root, churn):
    check_session_rows(churn, lambda: read_sessions(root).to_pylist())


def test_the_sessions_view_never_goes_back_under_compaction(root, churn):
    con = connect(root)
    check_session_rows(churn, lambda: con.sql("SELECT session_id, revision, completions FROM sessions")
                       .to_arrow_table().to_pylist())


def test_a_writer_that_closed_leaves_every_call_in_the_table_once(root, tmp_path):
    with Churn(root, tmp_path) as churn:
        pass
    acked = churn.acknowledged()
    assert log_segments(root) == [] and live_files(root) == []  # a store at rest: an empty log
    table = DeltaTable(str(root / "completions")).to_pyarrow_table(columns=["session_id", "seq"])
    keys = list(zip(table["session_id"].to_pylist(), table["seq"].to_pylist(), strict=True))
    assert len(keys) == len(set(keys)) and set(keys) == acked
    assert {row["session_id"]: row["completions"] for row in read_sessions(root).to_pylist()} == dict(
        Counter(sid for sid, _ in acked))


class FirstRead:
    """Runs `between` once: right after the first of the patched reads returns, whichever runs first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, between: Callable[[], object]) -> None:
        self.monkeypatch, self.between, self.done = monkeypatch, between, False

    def patch(self, owner: object, name: str) -> FirstRead:
        real = getattr(owner, name)

        def read(*args, **kwargs):
            result = real(*args, **kwargs)
            if not self.done:
                self.done = True
                self.between()
            return result

        self.monkeypatch.setattr(owner, name, read)
        return self


def compacting(writer: StoreWriter, root: Path) -> Callable[[], None]:
    """A compaction of every session, checked to delete log segments holding rows."""
    def compact() -> None:
        before = log_segments(root)
        writer.compact_idle(0.0)
        writer.flush()  # the live file rewritten without the rows just committed
        assert [path for path in before if not path.exists()], "no segment deleted: the race is not set up"

    return compact


def recorded(writer: StoreWriter) -> dict[str, list[str]]:
    """Calls of two sessions, on log segments of one call each, with one compaction among them."""
    ids: dict[str, list[str]] = {"s0": [], "s1": []}
    for step, sid in enumerate(["s0", "s1", "s0", "s0", "s1"]):
        ids[sid].append(writer.record_completion(completion(sid))["completion_id"])
        if step == 2:
            writer.compact_idle(0.0)
    writer.flush()
    return ids


def test_a_segment_deleted_between_the_log_read_and_the_table_read_loses_nothing(root, monkeypatch):
    with StoreWriter(root, segment_bytes=1) as writer:
        ids = recorded(writer)
        FirstRead(monkeypatch, compacting(writer, root)).patch(reading_module, "log_rows").patch(
            reading_module, "open_table")
        tables = read_completions(root, None, ["seq", "completion_id"])
        assert {sid: table["completion_id"].to_pylist() for sid, table in tables.items()} == ids
        assert [table["seq"].to_pylist() for table in tables.values()] == [[0, 1, 2], [0, 1]]


def test_a_segment_deleted_within_a_statements_refresh_loses_nothing(root, monkeypatch):
    with StoreWriter(root, segment_bytes=1) as writer:
        ids = recorded(writer)
        con = connect(root)  # the tables are opened: the refresh reads the log, then updates each table
        FirstRead(monkeypatch, compacting(writer, root)).patch(catalog_module, "log_rows").patch(
            DeltaTable, "update_incremental")
        got = con.execute("SELECT session_id, completion_id FROM completions ORDER BY session_id, seq").fetchall()
        assert got == [(sid, cid) for sid, listed in ids.items() for cid in listed]


def test_a_segment_deleted_after_it_was_listed_hides_no_session(root, monkeypatch):
    """A reader listed the log, then compaction committed the segments' rows and deleted them before the
    reader opened them: every session is still listed and recorded (from the table), its rows read once,
    its next seq still follows them, and nothing raises."""
    with StoreWriter(root, segment_bytes=1) as writer:
        ids = recorded(writer)
        listed = log_segments(root)
    assert listed and not any(path.exists() for path in listed)  # the close committed every call
    monkeypatch.setattr("tracetap.store.log_reading.log_segments", lambda _root: listed)
    reader = StoreReader(root)
    assert reader.session_ids() == ["s0", "s1"]
    assert reader.recorded("s0") and reader.recorded("s1")
    assert {sid: table["completion_id"].to_pylist() for sid, table in
            reader.completions_of(["s0", "s1"], ["completion_id"]).items()} == ids
    with StoreWriter(root) as writer:
        assert writer.record_completion(completion("s0"))["seq"] == 3


def test_reads_show_the_log_rows_past_what_the_tables_version_holds(root):
    with StoreWriter(root) as writer:
        stored = [writer.record_completion(completion("s1")) for _ in range(3)]
        assert compact_sessions(root) == {"s1": 3}  # commits; the log keeps the rows (its writer deletes them)
        assert committed_seqs(open_table(root, "completions")) == {"s1": 3}
        assert len(log_rows(root, "s1")) == 3
        stored += [writer.record_completion(completion("s1")) for _ in range(2)]  # only in the log
        expected = [row["completion_id"] for row in stored]
        assert read_completions(root, ["s1"], ["completion_id"])["s1"]["completion_id"].to_pylist() == expected
        sql = "SELECT completion_id FROM completions ORDER BY seq"
        assert [cid for (cid,) in connect(root).execute(sql).fetchall()] == expected
        assert scan(root, "completions").sort("seq").collect()["completion_id"].to_list() == expected


def test_uncommitted_keeps_the_log_rows_at_or_past_each_sessions_count():
    logged = pa.table({"session_id": ["a", "a", "a", "b", "c"], "seq": [0, 1, 2, 0, 5]})
    kept = uncommitted(logged, {"a": 2, "b": 1})
    assert list(zip(kept["session_id"].to_pylist(), kept["seq"].to_pylist(), strict=True)) == [("a", 2), ("c", 5)]


def test_a_hole_in_the_log_is_read_as_it_is(root):
    StoreWriter(root).close()
    (root / "log").mkdir(exist_ok=True)
    lines = [encode_line({**completion("h"), "seq": seq, "completion_id": f"c-{seq}"}) for seq in (0, 2)]
    (root / "log" / "0dead-000000.jsonl").write_bytes(b"".join(lines))  # seq 1 never written
    assert compact_sessions(root) == {"h": 1}  # seq 0 only: compaction stops at the gap
    assert read_completions(root, ["h"], ["seq"])["h"]["seq"].to_pylist() == [0, 2]
    assert connect(root).execute("SELECT seq FROM completions ORDER BY seq").fetchall() == [(0,), (2,)]


def test_a_read_pinned_to_a_version_reads_it_alone(root):
    with StoreWriter(root) as writer:
        for _ in range(2):
            writer.record_completion(completion("s1"))
        writer.close_session("s1")
        version = {table: open_table(root, table).version() for table in ("completions", "sessions")}
        writer.record_completion(completion("s1"))
        writer.close_session("s1")
        writer.record_completion(completion("s1"))  # only in the log
        assert read_completions(root, ["s1"], ["seq"])["s1"]["seq"].to_pylist() == [0, 1, 2, 3]
        pinned = read_completions(root, ["s1"], ["seq"], as_of=version["completions"])
        assert pinned["s1"]["seq"].to_pylist() == [0, 1]
        assert read_sessions(root, ["s1"], as_of=version["sessions"]).column("completions").to_pylist() == [2]
        writer.flush()
        assert read_sessions(root, ["s1"]).column("completions").to_pylist() == [4]


def session_row(sid: str, revision: int, completions: int) -> dict:
    return {"session_id": sid, "status": "open", "completions": completions, "revision": revision}


def test_of_the_committed_row_and_live_rows_the_highest_revision_wins(root):
    with StoreWriter(root) as writer:
        writer.record_completion(completion("s1"))
        writer.close_session("s1")
        [committed] = read_sessions(root, ["s1"]).to_pylist()
    assert live_files(root) == [] and committed["completions"] == 1
    rev = committed["revision"]
    write_live(root, "dead1", [session_row("s1", rev - 1, 0), session_row("s2", 1, 7)])  # a stale copy
    write_live(root, "dead2", [session_row("s2", 3, 9)])  # two writers' copies of s2
    readers = {
        "python": lambda: read_sessions(root).to_pylist(),
        "reader": lambda: StoreReader(root).sessions(),
        "sql": lambda: connect(root).sql("SELECT * FROM sessions").to_arrow_table().to_pylist(),
        "scan": lambda: scan(root, "sessions").collect().to_dicts()}
    for name, read in readers.items():
        got = {row["session_id"]: (row["revision"], row["completions"]) for row in read()}
        assert got == {"s1": (rev, 1), "s2": (3, 9)}, name
    write_live(root, "dead1", [session_row("s1", rev + 1, 5)])  # a newer copy than the committed row
    for name, read in readers.items():
        assert {row["session_id"]: row["completions"] for row in read()} == {"s1": 5, "s2": 9}, name
    assert StoreReader(root).session("s1")["revision"] == rev + 1


def test_a_live_file_committed_between_the_live_read_and_the_table_read_loses_no_row(root, monkeypatch):
    with StoreWriter(root) as writer:
        writer.record_completion(completion("s1"))
        writer.close_session("s1")
        writer.record_completion(completion("s1"))
        writer.register_session("s2", task_id="t2")  # s2: only in the live file
        writer.flush()
        assert read_sessions(root, ["s2"]).num_rows == 1 and live_files(root)

        def commit_all() -> None:
            writer.compact_idle(0.0)
            writer.flush()
            assert not live_files(root), "the live file stayed: the race is not set up"

        FirstRead(monkeypatch, commit_all).patch(reading_module, "read_live").patch(reading_module, "open_table")
        got = {row["session_id"]: (row["completions"], row["task_id"]) for row in read_sessions(root).to_pylist()}
        assert got == {"s1": (2, None), "s2": (0, "t2")}


def test_rows_a_crashed_writer_left_in_the_log_read_back_and_are_committed_once(root):
    stored = abandoned_writer_store(root, [completion("s1") for _ in range(3)])
    assert open_table(root, "completions") is None  # nothing committed: the rows are only in the log
    assert read_completions(root, ["s1"], ["completion_id"])["s1"]["completion_id"].to_pylist() == [
        row["completion_id"] for row in stored]
    StoreWriter(root).close()  # recovers: commits them, then drops the segments
    assert log_segments(root) == [] and committed_seqs(open_table(root, "completions")) == {"s1": 3}
    assert connect(root).execute("SELECT count(*), count(DISTINCT seq) FROM completions").fetchone() == (3, 3)
