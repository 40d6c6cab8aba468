"""Compaction (store/compaction.py): logged calls move into the completions Delta table, many sessions a
commit, only the calls the table lacks, each call once whoever compacts and however compactions race."""

import json
import subprocess
import sys
import textwrap
import threading

import pyarrow.compute as pc
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable
from store_rows import abandoned_writer_store, completion, log_names, snapshot, table_calls, wait_for
from tracetap.store import InvalidSessionId, StoreReader, StoreWriter, connect, scan
from tracetap.store.compaction import commit_logged, compact_sessions, recorded_sessions
from tracetap.store.delta import WRITER_KEY
from tracetap.store.log_reading import log_rows

from tracetap.cli import cli


def crashed(root, calls: dict[str, int]) -> list[dict]:
    """`{session: count}` calls left only in the log by a killed writer; returns them as stored."""
    rows = [completion(sid, prompt_token_ids=[i, i + 1]) for sid, count in calls.items() for i in range(count)]
    return abandoned_writer_store(root, rows)


def table(root) -> DeltaTable:
    return DeltaTable(str(root / "completions"))


def seqs(root, sid="s1"):
    sql = "SELECT seq FROM completions WHERE session_id = ? ORDER BY seq"
    return [r[0] for r in connect(root).execute(sql, [sid]).fetchall()]


def log_snapshot(root):
    return {name: data for name, data in snapshot(root).items() if name.startswith("log/")}


def test_one_commit_holds_the_calls_of_many_sessions(root):
    crashed(root, {"a": 2, "b": 3, "c": 1})
    logged = log_rows(root)
    assert commit_logged(root, logged.filter(pc.field("session_id") == "c"), "first") == {"c": 1}
    before = table(root).version()
    assert commit_logged(root, logged, "test") == {"a": 2, "b": 3, "c": 1}
    assert table(root).version() == before + 1  # a and b in one commit (c held already)
    [latest] = table(root).history(1)
    assert latest["operation"] == "WRITE" and latest[WRITER_KEY] == "test"
    assert (latest["operationMetrics"]["num_added_rows"], latest["operationMetrics"]["num_added_files"]) == (5, 2)
    files = StoreReader(root).files("completions")  # one file per session per commit, in its partition
    assert sorted(uri.split("/")[-2] for uri in files) == ["session_id=a", "session_id=b", "session_id=c"]
    assert table_calls(root) == {"a": [0, 1], "b": [0, 1, 2], "c": [0]}


def test_only_the_calls_the_table_lacks_are_committed(root):
    stored = crashed(root, {"s1": 5})
    logged = log_rows(root)
    assert commit_logged(root, logged.filter(pc.field("seq") < 3), "test") == {"s1": 3}
    first = set(table(root).file_uris())
    assert commit_logged(root, logged, "test") == {"s1": 5}
    [latest] = table(root).history(1)
    metrics = latest["operationMetrics"]
    assert (metrics["num_added_rows"], metrics["num_removed_files"]) == (2, 0)
    assert first < set(table(root).file_uris())  # the calls committed first were not written again
    version = table(root).version()
    assert commit_logged(root, logged, "test") == {"s1": 5}
    assert table(root).version() == version  # nothing lacking: no commit
    assert table_calls(root) == {"s1": [0, 1, 2, 3, 4]}
    assert StoreReader(root).completions("s1").to_pylist() == stored


def test_a_gap_stops_a_sessions_run_and_no_other(root):
    crashed(root, {"s1": 5, "s2": 2})
    logged = log_rows(root)
    on_its_way = (pc.field("session_id") == "s1") & (pc.field("seq") == 2)
    assert commit_logged(root, logged.filter(~on_its_way), "test") == {"s1": 2, "s2": 2}
    assert table_calls(root) == {"s1": [0, 1], "s2": [0, 1]}
    version = table(root).version()
    assert commit_logged(root, logged.filter(pc.field("seq") >= 3), "test") == {"s1": 2}  # past the gap only
    assert table(root).version() == version
    assert commit_logged(root, logged, "test") == {"s1": 5, "s2": 2}
    assert table_calls(root) == {"s1": [0, 1, 2, 3, 4], "s2": [0, 1]}


RACER = textwrap.dedent("""
    import json, pathlib, sys, time
    from tracetap.store import compact_sessions
    root, go, name, sessions = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4:] or None
    (go.parent / f"ready {name}").touch()  # imported: the race starts when every racer is
    while not go.exists():
        time.sleep(0.001)
    print(json.dumps(compact_sessions(root, sessions, writer=name)))
""")


def race(tmp_path, root, sessions: list[list[str]]) -> list[dict]:
    """Compact in one spawned process per entry of `sessions` (its session ids; [] for all), started
    together; what each reports."""
    go = tmp_path / "go"
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(root), str(go), f"racer{n}", *ids],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for n, ids in enumerate(sessions)]
    assert wait_for(lambda: len(list(tmp_path.glob("ready *"))) == len(racers))
    go.touch()
    outputs = [racer.communicate(timeout=120) for racer in racers]
    assert [racer.returncode for racer in racers] == [0] * len(racers), [err for _, err in outputs]
    return [json.loads(out) for out, _ in outputs]


def test_compactions_racing_on_one_session_commit_each_call_once(root, tmp_path):
    """Compactors in several processes (a gateway's, `tracetap compact`, a takeover) read what the table
    lacks at the same moment and commit it; deltalake refuses all but one commit, the others run again."""
    stored = crashed(root, {"s1": 30, "s2": 10})
    reports = race(tmp_path, root, [[], [], []])
    assert {"s1": 30, "s2": 10} in reports
    assert table_calls(root) == {"s1": list(range(30)), "s2": list(range(10))}
    ids = table(root).to_pyarrow_table(columns=["completion_id"]).column(0).to_pylist()
    assert sorted(ids) == sorted(row["completion_id"] for row in stored)
    assert seqs(root) == list(range(30))


def test_compactions_of_different_sessions_at_once_undo_none_of_each_others_calls(root, tmp_path):
    sessions = [f"s{n}" for n in range(4)]
    stored = crashed(root, {sid: 5 + n for n, sid in enumerate(sessions)})
    assert race(tmp_path, root, [[sid] for sid in sessions]) == [{sid: 5 + n} for n, sid in enumerate(sessions)]
    assert table_calls(root) == {sid: list(range(5 + n)) for n, sid in enumerate(sessions)}
    assert {sid: rows.to_pylist() for sid, rows in StoreReader(root).completions_of(sessions).items()} == {
        sid: [row for row in stored if row["session_id"] == sid] for sid in sessions}


def test_tracetap_compact_commits_the_log_and_leaves_it_to_its_writer(root):
    stored = crashed(root, {"run-1": 3, "run-2": 1})
    log = log_snapshot(root)

    def compact(*args):
        result = CliRunner().invoke(cli, ["compact", "--store", str(root), *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    assert json.loads(compact("--json")) == {"run-1": 3, "run-2": 1}
    assert log_snapshot(root) == log  # not a byte of the log changed
    assert table_calls(root) == {"run-1": [0, 1, 2], "run-2": [0]}
    assert json.loads(compact("--json")) == {} and json.loads(compact("--json", "--session", "run-1")) == {}
    assert compact().splitlines()[-1] == "compacted 0 session(s)"
    assert connect(root).execute("SELECT count(*) FROM completions").fetchone() == (4,)  # each call once
    with StoreWriter(root) as writer:
        assert log_names(root) == []  # the next writer deletes the segments the table holds
        assert writer.record_completion(completion("run-1"))["seq"] == 3
    assert table_calls(root) == {"run-1": [0, 1, 2, 3], "run-2": [0]}
    assert StoreReader(root).completions("run-2").to_pylist() == [stored[3]]


def test_tracetap_compact_refuses_a_session_without_calls(root):
    StoreWriter(root).close()
    result = CliRunner().invoke(cli, ["compact", "--store", str(root), "--session", "never-seen"])
    assert result.exit_code != 0 and "no completions" in result.output


def test_compact_sessions_reports_what_it_committed(root):
    StoreWriter(root).close()
    assert compact_sessions(root) == {}
    crashed(root, {"a": 2, "b": 3})
    assert compact_sessions(root, ["a"]) == {"a": 2}
    assert table_calls(root) == {"a": [0, 1]}
    assert compact_sessions(root) == {"b": 3}
    assert compact_sessions(root) == {}
    assert compact_sessions(root, ["never-seen"]) == {}
    with pytest.raises(InvalidSessionId):
        compact_sessions(root, ["../a"])


def test_recorded_sessions_are_those_with_calls_in_the_log_or_the_table(root):
    assert recorded_sessions(root) == []
    with StoreWriter(root) as writer:
        writer.record_completion(completion("a"))
        writer.record_completion(completion("c"))
        writer.register_session("quiet", task_id="t")  # a row, but no call
    crashed(root, {"b": 1, "c": 1})
    assert table_calls(root) == {"a": [0], "c": [0]} and recorded_sessions(root) == ["a", "b", "c"]
    assert StoreReader(root).session_ids() == ["a", "b", "c"]
    compact_sessions(root)
    assert recorded_sessions(root) == ["a", "b", "c"]


def test_readers_see_each_call_once_between_a_commit_and_the_deletion_of_its_segments(root):
    stored = crashed(root, {"s1": 5})
    compact_sessions(root)  # committed, the log untouched: as a writer killed before deleting its segments
    assert len(log_rows(root)) == 5 and table_calls(root) == {"s1": [0, 1, 2, 3, 4]}
    assert seqs(root) == [0, 1, 2, 3, 4]
    assert scan(root, "completions").select("seq").collect()["seq"].sort().to_list() == [0, 1, 2, 3, 4]
    assert StoreReader(root).completions("s1").to_pylist() == stored
    with StoreWriter(root) as writer:
        assert writer.record_completion(completion())["seq"] == 5
    assert table_calls(root) == {"s1": [0, 1, 2, 3, 4, 5]} and log_names(root) == []


def test_appends_during_compaction_are_never_lost_or_doubled(root):
    """The writer's own compactor and `tracetap compact` commit one session's calls while it records and
    SQL reads it: every read shows seqs 0..n-1 once each, including every call acknowledged before it."""
    stop, errors, observed, acked = threading.Event(), [], [], []
    writer = StoreWriter(root)

    def append():
        try:
            for i in range(60):
                acked.append(writer.record_completion(completion(prompt_token_ids=[i]))["seq"])
                if i % 10 == 9:
                    writer.compact_idle(0)
        finally:
            stop.set()

    def compact():
        while not stop.is_set():
            try:
                compact_sessions(root, ["s1"])
            except Exception as exc:  # compaction must cope with writes and commits landing while it runs
                errors.append(repr(exc))
                return

    def read():
        con = connect(root)
        while not stop.is_set():
            before = len(acked)
            try:
                got = [r[0] for r in con.execute("SELECT seq FROM completions").fetchall()]
            except Exception as exc:  # no read may fail
                errors.append(repr(exc))
                return
            observed.append(got)
            if sorted(got) != list(range(len(got))) or len(got) < before:
                errors.append(sorted(got))

    threads = [threading.Thread(target=f) for f in (append, compact, read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.close()
    assert errors == []
    assert len(observed) >= 5
    assert seqs(root) == list(range(60))
    assert table_calls(root) == {"s1": list(range(60))} and log_names(root) == []


def test_sql_reads_during_a_whole_store_compaction_never_fail_or_miscount(root):
    """`tracetap compact` over many sessions, each with committed calls and logged ones, while SQL counts."""
    sessions = [f"c{n}" for n in range(60)]
    with StoreWriter(root) as writer:  # its close commits every session's calls
        for sid in sessions:
            writer.record_completion(completion(sid))
            writer.record_completion(completion(sid))
    counts, errors, done = [], [], threading.Event()

    def read() -> None:
        con = connect(root)
        while not done.is_set():
            try:
                counts.append(con.execute("SELECT count(*) FROM completions").fetchone()[0])
            except Exception as error:  # reported below
                errors.append(error)

    with StoreWriter(root) as writer:  # every session: committed calls plus one in the log
        for sid in sessions:
            writer.record_completion(completion(sid))
        reader = threading.Thread(target=read)
        reader.start()
        try:
            assert compact_sessions(root) == {sid: 1 for sid in sessions}
        finally:
            done.set()
            reader.join()
    assert errors == [] and counts and set(counts) == {3 * len(sessions)}
    assert table_calls(root) == {sid: [0, 1, 2] for sid in sessions}


def test_what_the_table_holds_is_counted_right_across_its_checkpoints(root):
    """Commits past the checkpoint interval (store/delta.py): a writer opening the table reads its counts
    from a checkpoint plus the commits after it."""
    with StoreWriter(root) as writer:
        for n in range(25):
            writer.record_completion(completion(f"s{n % 3}"))
            writer.compact_idle(0)
    assert list((root / "completions" / "_delta_log").glob("*.checkpoint.parquet"))
    assert table_calls(root) == {"s0": list(range(9)), "s1": list(range(8)), "s2": list(range(8))}
    with StoreWriter(root) as writer:
        assert writer.record_completion(completion("s0"))["seq"] == 9
    assert compact_sessions(root) == {} and table_calls(root)["s0"] == list(range(10))
