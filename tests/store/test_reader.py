"""The reader API (store/reader.py) and the one visibility rule it shares with SQL (store/reading.py): the
table's version, plus the log rows past what it holds."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from store_rows import completion
from tracetap.store import (
    InvalidSessionId,
    StoreError,
    StoreReader,
    StoreWriter,
    compact_sessions,
    connect,
    read_task,
    read_tasks,
    save_task,
    write_session_table,
)
from tracetap.store.delta import committed_seqs, open_table
from tracetap.store.log_reading import log_rows

PROJECT = Path(__file__).resolve().parents[2]


def trace(index: int, builder: str = "per_request") -> dict:
    return {"builder": builder, "trace_index": index, "loss_mask": [1], "completion_ids": [f"c{index}"]}


@pytest.fixture
def filled(root: Path) -> Iterator[Path]:
    """Sessions a (3 calls, committed after 2, then one more), b (1 call), with traces and rewards, read while
    their writer is open: a's third call and b's are only in its log (its close would commit them)."""
    with StoreWriter(root) as w:
        for _ in range(2):
            w.record_completion(completion("a"))
        w.close_session("a")
        w.record_completion(completion("a", task_id="t"))
        w.record_completion(completion("b"))
        w.register_session("b", task_id="tb")
        for sid in ("a", "b"):
            write_session_table(root, "trajectories", sid, [trace(1), trace(0)], builder="per_request")
            write_session_table(root, "rewards", sid, [{"evaluator": "e", "reward": 0.5}], evaluator="e")
        write_session_table(root, "trajectories", "a", [trace(0, "prefix_merging")],
                            builder="prefix_merging")
        write_session_table(root, "rewards", "a", [{"evaluator": "f", "reward": 1.0}], evaluator="f")
        yield root


def test_a_session_reads_in_seq_order_across_the_table_and_the_log(filled):
    reader = StoreReader(filled)
    assert reader.session_ids() == ["a", "b"]
    table = reader.completions("a", ["seq", "task_id"])
    assert table.column_names == ["seq", "task_id"]
    assert table["seq"].to_pylist() == [0, 1, 2] and table["task_id"].to_pylist() == [None, None, "t"]
    assert reader.completions("nobody").num_rows == 0


def test_several_sessions_read_at_once(filled):
    tables = StoreReader(filled).completions_of(["b", "a", "nobody"], ["session_id", "seq"])
    assert {sid: t["seq"].to_pylist() for sid, t in tables.items()} == {"b": [0], "a": [0, 1, 2], "nobody": []}


def test_session_trajectory_and_reward_rows(filled):
    reader = StoreReader(filled)
    assert reader.session("b")["task_id"] == "tb" and reader.session("nobody") is None
    assert [row["session_id"] for row in reader.sessions()] == ["a", "b"]
    traces = reader.trajectories("per_request")
    assert [(r["session_id"], r["trace_index"]) for r in traces.to_pylist()] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert reader.trajectories("prefix_merging", ["b"]).num_rows == 0
    assert reader.trajectory_session_ids("prefix_merging") == ["a"]
    assert [(r["session_id"], r["evaluator"]) for r in reader.rewards()] == [("a", "e"), ("a", "f"), ("b", "e")]
    assert [r["session_id"] for r in reader.rewards("f")] == ["a"]
    assert reader.recorded("a") and reader.recorded("b") and not reader.recorded("nobody")  # b: only in the log


@pytest.mark.parametrize("bad", ["../a", "", "a/b"])
def test_bad_session_ids_fail_before_any_path_is_built(filled, bad):
    with pytest.raises(InvalidSessionId):
        StoreReader(filled).completions(bad)
    with pytest.raises(InvalidSessionId):
        connect(filled, session_ids=[bad])


def test_a_directory_that_is_no_store_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="not a tracetap store"):
        StoreReader(tmp_path)


def test_task_records_read_back_by_task_id(root):
    assert read_tasks(root) == {} and read_task(root, "t1") is None
    save_task(root, "t1", "running", {"task_id": "t1"}, {"status": "running"})
    save_task(root, "t2", "running", {"task_id": "t2"}, {"status": "running"})
    save_task(root, "t1", "completed", {"task_id": "t1"}, {"status": "completed"})  # replaces t1's row
    assert read_tasks(root) == {"t1": {"request": {"task_id": "t1"}, "result": {"status": "completed"}},
                                "t2": {"request": {"task_id": "t2"}, "result": {"status": "running"}}}
    assert read_task(root, "t2")["result"] == {"status": "running"}
    with pytest.raises(ValueError, match="task id"):
        save_task(root, "../t", "running", {}, {})


def test_a_connection_for_some_sessions_shows_only_them_in_every_view(filled):
    con = connect(filled, session_ids=["b"])
    for table in ("completions", "sessions", "rewards", "trajectories"):
        assert con.execute(f"SELECT DISTINCT session_id FROM {table}").fetchall() == [("b",)], table
    assert connect(filled, session_ids=["nobody"]).execute("SELECT count(*) FROM completions").fetchone() == (0,)


def test_views_follow_a_table_from_no_files_to_some(root):
    StoreWriter(root).close()
    con = connect(root)
    assert con.execute("SELECT count(*) FROM trajectories").fetchone() == (0,)
    write_session_table(root, "trajectories", "s", [trace(0)], builder="per_request")
    assert con.execute("SELECT count(*) FROM trajectories").fetchone() == (1,)


def test_a_data_file_missing_from_its_version_fails_the_read_instead_of_hiding_rows(filled):
    """A file the table's version lists and the disk lacks (deleted by hand, a vacuum run without
    retention under a reader) fails the read: no reader skips it and shows fewer rows."""
    import duckdb

    con = connect(filled)
    reader = StoreReader(filled)
    [listed] = reader.files("completions")  # a's two committed calls
    gone = Path(listed.removeprefix("file://"))
    data = gone.read_bytes()
    gone.unlink()
    try:
        with pytest.raises(duckdb.Error):
            con.execute("SELECT count(*) FROM completions").fetchall()
        with pytest.raises(OSError):
            reader.completions("a")
    finally:
        gone.write_bytes(data)
    assert con.execute("SELECT count(*) FROM completions").fetchone() == (4,)


def test_reads_show_the_tables_version_and_the_log_rows_past_it(filled):
    assert committed_seqs(open_table(filled, "completions")) == {"a": 2}
    assert sorted(log_rows(filled, columns=["session_id", "seq"]).to_pylist(), key=lambda r: (r["session_id"], r["seq"])
                  ) == [{"session_id": "a", "seq": 2}, {"session_id": "b", "seq": 0}]  # a's first two: committed
    assert compact_sessions(filled) == {"a": 1, "b": 1}  # the log keeps its rows: its writer deletes them
    assert committed_seqs(open_table(filled, "completions")) == {"a": 3, "b": 1}
    assert log_rows(filled).num_rows == 2
    reader = StoreReader(filled)
    assert {sid: t["seq"].to_pylist() for sid, t in reader.completions_of(["a", "b"], ["seq"]).items()} == {
        "a": [0, 1, 2], "b": [0]}
    assert connect(filled).execute("SELECT session_id, seq FROM completions ORDER BY ALL").fetchall() == [
        ("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    assert len(reader.files("completions")) == 3  # a file a session a commit, deltalake's names
    assert all(Path(uri).name.startswith("part-00000-") for uri in reader.files("completions"))


def test_a_stray_internal_import_fails_the_lint_outside_store():
    def lint(source: str, filename: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--stdin-filename", filename, "-"],
                              input=source, capture_output=True, text=True, cwd=PROJECT)

    stray = "from tracetap.store.paths import log_segments\n\nprint(log_segments)\n"
    done = lint(stray, "builders/stray.py")
    assert done.returncode == 1 and "TID251" in done.stdout, done.stdout + done.stderr
    assert lint("from tracetap.store import paths\n\nprint(paths)\n", "report/stray.py").returncode == 1
    assert lint(stray, "store/stray.py").returncode == 0
    assert lint(stray.replace("store.paths", "store"), "builders/stray.py").returncode == 0


def test_every_store_module_is_banned_outside_store():
    config = tomllib.loads((PROJECT / "pyproject.toml").read_text())
    banned = config["tool"]["ruff"]["lint"]["flake8-tidy-imports"]["banned-api"]
    modules = {f"tracetap.store.{path.stem}" for path in (PROJECT / "store").glob("*.py") if path.stem != "__init__"}
    assert modules <= set(banned), sorted(modules - set(banned))


def test_a_reader_reads_each_delta_table_at_one_version(filled):
    reader = StoreReader(filled)
    before = reader.trajectories("per_request").to_pylist()
    versions = reader.versions()
    write_session_table(filled, "trajectories", "a", [], builder="per_request")  # another writer commits
    assert reader.trajectories("per_request").to_pylist() == before and reader.versions() == versions
    fresh = StoreReader(filled)
    assert fresh.trajectory_session_ids("per_request") == ["b"]
    assert fresh.versions()["trajectories"] == versions["trajectories"] + 1


def test_one_readers_live_reads_follow_each_commit_in_every_thread(root):
    """A reader keeps its completions and sessions tables open between live reads (one per thread) and brings
    them up to date at each: a call committed, or compacted and vacuumed away from the log, between two reads
    is in the second."""
    with StoreWriter(root) as writer:
        writer.record_completion(completion("s1"))
        writer.close_session("s1")
        reader = StoreReader(root)
        assert reader.completions("s1").num_rows == 1 and reader.session("s1")["completions"] == 1
        for n in range(2, 5):
            writer.record_completion(completion("s1"))
            writer.close_session("s1")  # a new version of both tables
            assert [reader.completions("s1").num_rows, reader.session("s1")["completions"]] == [n, n]
            with ThreadPoolExecutor(1) as other:
                assert other.submit(lambda: reader.completions("s1").num_rows).result() == n
    assert reader.versions()["completions"] == open_table(root, "completions").version()
