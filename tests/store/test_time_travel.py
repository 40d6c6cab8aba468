"""Time travel (store/time_travel.py): parsing a moment, resolving it to each Delta table's version, and the
readers (StoreReader, connect) reading committed rows only as of then."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from store_rows import completion
from tracetap.store import (
    AsOf,
    AsOfError,
    StoreReader,
    StoreWriter,
    connect,
    history,
    parse_as_of,
    vacuum,
    write_session_table,
    write_session_tables,
)


def versions_of(root: Path, table: str) -> list:
    """The table's commits (TableVersion), oldest first."""
    return sorted(history(root, [table]), key=lambda commit: commit.version)


def count(root: Path, as_of: AsOf | None, sql: str = "SELECT count(*) FROM completions") -> int:
    return connect(root, as_of=as_of).execute(sql).fetchone()[0]


@pytest.fixture
def store(root: Path) -> Path:
    """Session a (one call) committed, then b (two calls), then a's second call: three completions commits, each
    followed by a commit of its session's row (and the writer's close commits the rows once more); then a
    trajectories commit."""
    with StoreWriter(root) as writer:
        writer.record_completion(completion("a"))
        writer.close_session("a")
        for _ in range(2):
            writer.record_completion(completion("b"))
        writer.close_session("b")
        writer.record_completion(completion("a"))
        writer.close_session("a")
    write_session_table(root, "trajectories", "a", [{"trace_index": 0}], builder="b")
    return root


@pytest.mark.parametrize(("text", "time", "versions"), [
    ("3", None, (("completions", 3),)),
    (" completions=2, sessions=0 ", None, (("completions", 2), ("sessions", 0))),
    ("trajectories=7", None, (("trajectories", 7),)),
    ("2026-01-05T10:00:00", datetime(2026, 1, 5, 10, tzinfo=UTC), ()),  # naive: UTC
    ("2026-01-05T12:00:00.250+02:00", datetime(2026, 1, 5, 10, 0, 0, 250000, tzinfo=UTC), ()),
    ("2026-01-05", datetime(2026, 1, 5, tzinfo=UTC), ()),
])
def test_parse_each_form(text, time, versions):
    as_of = parse_as_of(text)
    assert (as_of.text, as_of.time, as_of.versions, as_of.pins) == (text, time, versions, None)


@pytest.mark.parametrize(("text", "message"), [
    ("", "is not a version"),
    ("-1", "is not a version"),
    ("yesterday", "is not a version (an integer from 0), an ISO 8601 timestamp, or TABLE=VERSION"),
    ("completions=x", "completions's version must be an integer from 0, not 'x'"),
    ("completions=", "completions's version must be an integer from 0, not ''"),
    ("logs=1", "unknown table 'logs' (tables: completions, sessions, rewards, trajectories, rollouts)"),
    ("sessions=1,sessions=2", "names sessions twice"),
    ("completions=²", "must be an integer"),
])
def test_parse_refuses_what_names_no_moment(text, message):
    with pytest.raises(AsOfError, match=None) as error:
        parse_as_of(text)
    assert repr(text) in str(error.value) and message in str(error.value)


def test_a_version_reads_completions_then_and_other_tables_as_of_its_commit(store):
    assert [commit.version for commit in versions_of(store, "completions")] == [0, 1, 2, 3]  # created, 3 closes
    as_of = parse_as_of("2")  # b's calls: committed before b's session row
    assert as_of.resolve(store) == {"completions": 2, "sessions": 1, "rewards": None, "trajectories": None,
                                    "rollouts": None}
    reader = StoreReader(store, as_of)
    assert reader.session_ids() == ["a", "b"]
    assert [row["session_id"] for row in reader.sessions()] == ["a"]
    calls = reader.completions_of(["a", "b"], ["seq"])
    assert (calls["a"].num_rows, calls["b"].num_rows) == (1, 2)
    assert reader.trajectories("b").num_rows == 0 and reader.versions() == as_of.resolve(store)


def test_table_versions_read_those_and_the_rest_as_of_the_latest_commit(store):
    pins = parse_as_of("sessions=2, completions=1").resolve(store)
    assert (pins["completions"], pins["sessions"], pins["trajectories"]) == (1, 2, None)
    reader = StoreReader(store, parse_as_of("sessions=2,completions=1"))
    assert reader.session_ids() == ["a"]
    assert [row["session_id"] for row in reader.sessions()] == ["a", "b"]  # the sessions row of b, its calls not
    latest = StoreReader(store).versions()
    assert parse_as_of("trajectories=1").resolve(store) == {**latest, "rewards": None, "rollouts": None}


def test_a_timestamp_reads_each_table_at_its_latest_version_by_then(store):
    b_row = versions_of(store, "sessions")[2]  # b's session row committed
    as_of = parse_as_of(b_row.timestamp.isoformat())
    assert as_of.resolve(store) == {"completions": 2, "sessions": 2, "rewards": None, "trajectories": None,
                                    "rollouts": None}
    assert count(store, as_of) == 3 and count(store, None) == 4
    naive = b_row.timestamp.replace(tzinfo=None).isoformat()  # UTC
    assert parse_as_of(naive).resolve(store) == as_of.resolve(store)
    later = parse_as_of((datetime.now(UTC) + timedelta(days=1)).isoformat())
    assert later.resolve(store) == {**StoreReader(store).versions(), "rewards": None, "rollouts": None}


def test_before_a_table_was_created_it_reads_empty(store):
    as_of = parse_as_of("2000-01-01")
    assert set(as_of.resolve(store).values()) == {None}
    reader = StoreReader(store, as_of)
    assert reader.session_ids() == [] and reader.sessions() == [] and reader.session("a") is None
    assert reader.completions("a").num_rows == 0 and not reader.recorded("a")
    assert reader.completions("a").schema == StoreReader(store).completions("a").schema
    assert reader.files("completions") == [] and reader.trajectory_session_ids("b") == []
    assert count(store, as_of) == 0 and count(store, as_of, "SELECT count(*) FROM sessions") == 0


@pytest.mark.parametrize(("text", "message"), [
    ("9", "'9': completions has no version 9 (its latest is 3)"),
    ("completions=1,sessions=99", "'completions=1,sessions=99': sessions has no version 99 (its latest is "),
    ("rollouts=0", "'rollouts=0': rollouts has no version 0 (it has no commits)"),
])
def test_a_version_the_store_lacks_is_an_error_naming_it(store, text, message):
    for read in (lambda: StoreReader(store, parse_as_of(text)), lambda: connect(store, as_of=parse_as_of(text))):
        with pytest.raises(AsOfError) as error:
            read()
        assert str(error.value).startswith(message)


def test_as_of_reads_no_uncommitted_rows(root):
    """Writer log rows and live session rows are not versioned: an as-of read never shows them."""
    with StoreWriter(root) as writer:
        writer.record_completion(completion("a"))
        writer.close_session("a")
        writer.record_completion(completion("a"))  # only in the writer's log
        writer.register_session("c", task_id="t")  # only in its live file
        writer.record_completion(completion("c"))
        now = parse_as_of(datetime.now(UTC).isoformat())
        live, past = StoreReader(root), StoreReader(root, now)
        assert live.session_ids() == ["a", "c"] and past.session_ids() == ["a"]
        assert live.completions("a").num_rows == 2 and past.completions("a").num_rows == 1
        assert past.session("c") is None and live.session("c")["task_id"] == "t"
        assert not past.recorded("c") and live.recorded("c")
        assert count(root, now) == 1 and count(root, None) == 3
        assert count(root, now, "SELECT count(*) FROM sessions") == 1


def test_a_connection_as_of_a_moment_reads_it_in_every_statement(store):
    con = StoreReader(store, parse_as_of("1")).connect()
    assert con.execute("SELECT count(*) FROM completions").fetchone()[0] == 1
    with StoreWriter(store) as writer:
        writer.record_completion(completion("d"))
    write_session_table(store, "trajectories", "d", [{"trace_index": 0}], builder="b")
    assert con.execute("SELECT count(*) FROM completions").fetchone()[0] == 1
    assert con.execute("SELECT count(*) FROM trajectories").fetchone()[0] == 0
    assert count(store, None) == 5


def test_a_pinned_moment_resolves_without_reading_the_store(store, tmp_path):
    pinned = parse_as_of("2").pin(store)
    assert pinned.pins is not None and pinned.text == "2"
    assert pinned.resolve(tmp_path / "nowhere") == parse_as_of("2").resolve(store)
    assert StoreReader(store, pinned).versions(["completions", "sessions"]) == {"completions": 2, "sessions": 1}


def test_a_live_reader_reports_the_versions_its_reads_loaded(store):
    reader = StoreReader(store)
    reader.completions("a")
    with StoreWriter(store) as writer:
        writer.record_completion(completion("d"))  # a commit of completions and sessions after the read
    assert reader.versions(["completions"]) == {"completions": 3}
    reader.completions("a")
    assert reader.versions(["completions", "trajectories"]) == {"completions": 4, "trajectories": 1}


def test_a_write_records_the_versions_it_read_in_its_commit(store):
    write_session_tables(store, "trajectories", [("a", [{"trace_index": 0}])], builder="b",
                         read_versions={"completions": 2, "sessions": None})
    newest, previous = history(store, ["trajectories"], 2)
    assert newest.read_versions == {"completions": 2, "sessions": None} and previous.read_versions is None


def test_a_version_whose_files_a_vacuum_deleted_is_an_error_naming_it(store):
    for value in (0.5, 1.0):
        write_session_table(store, "rewards", "a", [{"reward": value}], evaluator="e")
    replaced, latest = (commit.version for commit in versions_of(store, "rewards")[-2:])
    assert vacuum(store, retain_hours=0)["rewards"]
    with pytest.raises(AsOfError) as error:
        StoreReader(store, parse_as_of(f"rewards={replaced}"))
    assert str(error.value) == (f"'rewards={replaced}': rewards version {replaced} can no longer be read: "
                                "`tracetap vacuum` deleted 1 of its files")
    assert StoreReader(store, parse_as_of(f"rewards={latest}")).rewards("e")[0]["reward"] == 1.0
