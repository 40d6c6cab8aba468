"""The StoreWriter: durable calls in seq order, session rows, the compactor's commits to the Delta tables,
recovery of what a killed writer left, bounded memory, and the live session rows between commits."""

import asyncio
import json
import re
import threading
from collections import defaultdict
from datetime import UTC, datetime

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from store_rows import abandoned_writer_store, completion, log_names, snapshot, table_calls, wait_for
from tracetap.store import InvalidSessionId, StoreReader, StoreWriter, connect, migrate_store, scan
from tracetap.store.delta import committed_seqs, open_table, replace, sql_in
from tracetap.store.files import StoreError
from tracetap.store.live_sessions import write_live
from tracetap.store.log_reading import log_rows
from tracetap.store.owners import SessionOwned
from tracetap.store.paths import live_files, log_segments
from tracetap.store.reading import read_completions, read_sessions
from tracetap.store.schema import COMPLETIONS, MAX_REFUSED_HOSTS, OTHER_HOSTS, SCHEMA_VERSION
from tracetap.store.tables import rows_to_table


def session_row(root, sid="s1"):
    """The session's row as readers see it: of its committed row and the writers' live rows, the current one."""
    [row] = read_sessions(root, [sid]).to_pylist()
    return row


def committed_row(root, sid="s1"):
    """The session's row in the `sessions` Delta table itself (None when it has none)."""
    table = DeltaTable(str(root / "sessions")).to_pyarrow_table()
    rows = table.filter(pc.field("session_id") == sid).to_pylist()
    assert len(rows) <= 1, rows  # a commit replaces the session's row
    return rows[0] if rows else None


def forget_live_rows(root):
    """Delete every live session file, as a crash before its rewrite leaves the store: the table's rows
    are then behind the calls in the log."""
    for path in live_files(root):
        path.unlink()


def test_open_creates_a_readable_store_of_the_current_version(root):
    with StoreWriter(root):
        pass
    assert (root / "VERSION").read_text().strip() == str(SCHEMA_VERSION)
    assert StoreReader(root).session_ids() == []
    assert connect(root).execute("SELECT count(*) FROM sessions").fetchone() == (0,)
    assert log_names(root) == []


def test_newer_store_is_refused(root):
    root.mkdir()
    (root / "VERSION").write_text(f"{SCHEMA_VERSION + 1}\n")
    with pytest.raises(StoreError, match="schema version"):
        StoreWriter(root)


def test_two_writers_share_a_store_one_owner_per_session(writer, root):
    writer.record_completion(completion(session_id="mine"))
    with StoreWriter(root) as other:
        with pytest.raises(SessionOwned, match=writer.writer_id):
            other.record_completion(completion(session_id="mine"))
        assert other.record_completion(completion(session_id="theirs"))["seq"] == 0
        writer.close_session("mine")  # released: the other writer continues it after its calls
        assert other.record_completion(completion(session_id="mine"))["seq"] == 1
    assert [row["seq"] for row in StoreReader(root).completions("mine").to_pylist()] == [0, 1]


def test_record_fills_ids_and_logs_one_whole_line(writer, root):
    stored = writer.record_completion(completion(created_at=datetime(2026, 1, 1, tzinfo=UTC)))
    assert stored["seq"] == 0 and re.fullmatch(r"cmpl-[0-9a-f]{24}", stored["completion_id"])
    assert stored["finished_at"].tzinfo is not None and set(stored) == set(COMPLETIONS.names)
    assert open_table(root, "completions") is None  # nothing committed yet: the call is one log line
    [segment] = log_segments(root)
    assert segment.read_bytes().count(b"\n") == 1
    [line] = log_rows(root).to_pylist()
    assert line["prompt_suffix_ids"] == [1, 2, 3] and line["prompt_token_ids"] is None  # compact form
    assert read_completions(root, ["s1"])["s1"].to_pylist() == [stored]


def test_every_file_is_complete_and_no_temp_is_left(writer, root):
    for i in range(20):
        writer.record_completion(completion(f"s{i % 3}", completion_id=f"c-{i}"))
    writer.flush()
    files = [p for p in root.rglob("*") if p.is_file() and p.name not in ("VERSION",)]
    assert not [p for p in files if p.name.endswith(".tmp")]
    data = [p for p in files if p.suffix == ".parquet"]
    assert data == live_files(root)  # the writer's live session rows; the calls are in the log
    assert pq.read_table(data[0]).num_rows == 3
    assert log_rows(root).num_rows == 20 and table_calls(root) == {}


def test_given_completion_id_is_kept_and_checked(writer, root):
    assert writer.record_completion(completion(completion_id="chatcmpl-x1"))["completion_id"] == "chatcmpl-x1"
    with pytest.raises(ValueError, match="completion id"):
        writer.record_completion(completion(completion_id="../../etc"))


@pytest.mark.parametrize("sid", ["../x", "a/b", "", "a" * 129, ".hidden", None])
def test_invalid_session_id_is_rejected_before_touching_disk(writer, root, sid):
    writer.record_completion(completion("ok-session"))
    writer.flush()
    before = snapshot(root)
    with pytest.raises(InvalidSessionId):
        writer.record_completion(completion(sid))
    with pytest.raises(InvalidSessionId):
        writer.register_session(sid, task_id="t")
    assert snapshot(root) == before


@pytest.mark.parametrize("change, error", [({"status": "great"}, "status"), ({"colour": "red"}, "unknown"),
                                           ({"prompt_token_ids": "not a list"}, "column prompt_token_ids")])
def test_bad_rows_write_nothing(writer, root, change, error):
    writer.record_completion(completion())
    writer.flush()
    before = snapshot(root)
    with pytest.raises(ValueError, match=error):
        writer.record_completion({**completion(), **change})
    assert snapshot(root) == before
    assert writer.record_completion(completion())["seq"] == 1


def record(writer: StoreWriter, row: dict, caller: str) -> dict:
    """Record as a thread does, or as the gateway's event loop does (a new session starts right there)."""
    return asyncio.run(writer.record_completion_async(row)) if caller == "loop" else writer.record_completion(row)


CALLERS = pytest.mark.parametrize("caller", ["thread", "loop"])


@CALLERS
def test_seq_continues_after_reopen_and_compaction(root, caller):
    with StoreWriter(root) as w:
        for _ in range(3):
            w.record_completion(completion())
        w.close_session("s1")
        w.record_completion(completion())
    with StoreWriter(root) as w:
        assert record(w, completion(), caller)["seq"] == 4
        assert record(w, completion("new"), caller)["seq"] == 0
    rows = connect(root).execute("SELECT seq FROM completions WHERE session_id = 's1' ORDER BY seq")
    assert [r[0] for r in rows.fetchall()] == [0, 1, 2, 3, 4]
    assert table_calls(root) == {"s1": [0, 1, 2, 3, 4], "new": [0]}


def test_concurrent_writers_never_mix_sessions(writer, root):
    sessions, per_thread, threads = ["a", "b", "c"], 15, 6

    def work(t):
        for i in range(per_thread):
            sid = sessions[(t + i) % len(sessions)]
            writer.record_completion(completion(sid, metadata_json=json.dumps({"sid": sid, "t": t, "i": i})))

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    writer.flush()
    sql = "SELECT session_id, seq, completion_id, metadata_json FROM completions"
    rows = connect(root).execute(sql).fetchall()
    assert len(rows) == threads * per_thread
    seqs = defaultdict(list)
    for sid, seq, _, metadata in rows:
        assert json.loads(metadata)["sid"] == sid
        seqs[sid].append(seq)
    assert all(sorted(s) == list(range(len(s))) for s in seqs.values())
    assert len({r[2] for r in rows}) == len(rows)
    assert sum(session_row(root, sid)["completions"] for sid in sessions) == len(rows)


def test_session_row_sums_ok_calls_and_counts_failures(writer, root):
    writer.record_completion(completion(task_id="", metadata_json='{"harness": "codex"}'))
    writer.record_completion(completion(status="upstream_error", http_status=503, prompt_tokens=99,
                                        chat_response_json='{"error": "overloaded"}'))
    writer.record_completion(completion(task_id="task-1", prompt_tokens=10, completion_tokens=5))
    writer.record_completion(completion(status="timeout", http_status=504))
    writer.record_completion(completion(status="upstream_error", http_status=502, task_id="task-2"))
    writer.record_completion(completion(status="client_error", http_status=400))
    writer.flush()
    row = session_row(root)
    assert (row["task_id"], row["harness"], row["status"]) == ("task-1", "codex", "open")
    assert (row["completions"], row["prompt_tokens"], row["completion_tokens"]) == (6, 13, 7)
    assert json.loads(row["upstream_failures_json"]) == {"http_503": 1, "timeout": 1, "transport": 1,
                                                         "last_at": 5, "last_kind": "transport"}
    assert row["started_at"] <= row["ended_at"]


ERR, BODY = {"status": "upstream_error"}, {"chat_response_json": "{}"}


def said(kind):
    return {"metadata_json": json.dumps({"upstream_failure": kind})}


FAILURES = [
    ({**ERR, "http_status": 500, **BODY}, "http_500"),
    ({**ERR, "http_status": 502}, "transport"),
    ({**ERR, "http_status": 502, **said("http")}, "http_502"),
    ({**ERR, "http_status": 502, **BODY, **said("unreachable")}, "transport"),
    ({"status": "timeout", "http_status": 504}, "timeout"),
    ({**ERR, "http_status": 504, **said("timeout")}, "timeout"),
]


@pytest.mark.parametrize("columns, kind", FAILURES)
def test_failure_kinds(writer, root, columns, kind):
    writer.record_completion(completion(**columns))
    writer.flush()
    failures = json.loads(session_row(root)["upstream_failures_json"])
    assert failures == {kind: 1, "last_at": 1, "last_kind": kind}


def test_register_then_record_then_close(writer, root):
    writer.register_session("s1", task_id="t1", harness="claude_code", metadata={"sample": 2})
    assert session_row(root)["completions"] == 0  # register_session saves the row before it returns
    writer.record_completion(completion(task_id="other", metadata_json='{"harness": "codex"}'))
    closed = writer.close_session("s1")
    row = session_row(root)
    assert row == closed == committed_row(root)  # close_session committed the row
    assert (row["task_id"], row["harness"], row["status"]) == ("t1", "claude_code", "closed")
    assert row["completions"] == 1
    assert json.loads(row["metadata_json"]) == {"sample": 2}
    assert table_calls(root) == {"s1": [0]} and log_rows(root, "s1").num_rows == 0  # and its calls
    writer.record_completion(completion())
    writer.flush()
    assert session_row(root)["status"] == "open"


def test_a_session_row_behind_its_calls_after_a_crash_is_recounted(root):
    with StoreWriter(root) as w:
        w.record_completion(completion(task_id="t"))
    abandoned_writer_store(root, [completion(status="timeout"), completion(prompt_tokens=7)])
    forget_live_rows(root)  # the crashed writer's row never reached its live file
    assert committed_row(root)["completions"] == 1
    with StoreWriter(root) as w:
        assert committed_row(root)["completions"] == 3  # recounted and committed when the writer opened
        w.record_completion(completion())
    row = session_row(root)
    assert (row["completions"], row["prompt_tokens"], row["task_id"]) == (4, 3 + 7 + 3, "t")
    assert json.loads(row["upstream_failures_json"])["timeout"] == 1
    assert committed_row(root) == row


def test_a_killed_writers_calls_are_committed_once_by_the_next_writer(root):
    stored = abandoned_writer_store(root, [completion("a"), completion("b"), completion("a")])
    forget_live_rows(root)
    assert table_calls(root) == {}  # the killed writer committed nothing: its calls are in its log
    assert {sid: rows.to_pylist() for sid, rows in read_completions(root).items()} == {
        "a": [stored[0], stored[2]], "b": [stored[1]]}  # acknowledged, so readers see them already
    with StoreWriter(root) as w:
        assert table_calls(root) == {"a": [0, 1], "b": [0]}
        history = DeltaTable(str(root / "completions")).history()
        assert [commit["operation"] for commit in history] == ["WRITE", "CREATE TABLE"]  # both in one commit
        assert log_names(root) == []  # the dead writer's log went once the table held its rows
        assert session_row(root, "a")["completions"] == 2 and committed_row(root, "b")["completions"] == 1
        assert w.record_completion(completion("a"))["seq"] == 2
    with StoreWriter(root):
        pass  # nothing left to recover: nothing is committed twice
    assert table_calls(root) == {"a": [0, 1, 2], "b": [0]}
    ids = DeltaTable(str(root / "completions")).to_pyarrow_table(columns=["completion_id"]).column(0).to_pylist()
    assert {row["completion_id"] for row in stored} < set(ids) and len(ids) == len(set(ids)) == 4
    assert session_row(root, "a")["completions"] == 3


def test_a_killed_writers_live_rows_are_committed_by_the_next_writer(root):
    abandoned_writer_store(root, [completion(task_id="t"), completion(prompt_tokens=7)], flush=True)
    [live] = live_files(root)
    shown = session_row(root)  # readers see the row in the killed writer's live file
    assert (shown["completions"], shown["prompt_tokens"], shown["task_id"]) == (2, 10, "t")
    with StoreWriter(root):  # takes the dead writer over: its sessions end
        ended = {**shown, "status": "closed", "revision": shown["revision"] + 1}
        assert committed_row(root) == ended  # as it was (no recount needed), and closed
        assert not live.exists() and log_names(root) == []
    assert session_row(root) == ended


def test_compact_idle_only_touches_idle_sessions_with_uncommitted_calls(writer, root):
    writer.record_completion(completion("a"))
    writer.record_completion(completion("b"))
    assert writer.compact_idle(3600) == []
    assert table_calls(root) == {}
    assert sorted(writer.compact_idle(0)) == ["a", "b"]
    assert writer.compact_idle(0) == []
    assert table_calls(root) == {"a": [0], "b": [0]}
    assert committed_row(root, "a")["completions"] == committed_row(root, "b")["completions"] == 1
    writer.flush()
    assert log_names(root) == []  # every call and row is committed: no segment, no live rows


def test_closed_writer_refuses_writes(root):
    w = StoreWriter(root)
    w.close()
    with pytest.raises(StoreError, match="closed"):
        w.record_completion(completion())
    with StoreWriter(root):  # the store is free again
        pass


def test_cached_session_states_stay_under_the_cap(root):
    with StoreWriter(root, max_sessions=8) as w:
        for n in range(40):
            w.record_completion(completion(f"s{n}"))
        # states past the cap go to the compactor, and are dropped by a later call once committed
        assert wait_for(lambda: w.record_completion(completion("s39")) and w.cached_sessions == 8)
        held = table_calls(root)
        assert all(held.get(f"s{n}") == [0] for n in range(32))  # committed before the writer closed
        assert all(committed_row(root, f"s{n}")["completions"] == 1 for n in range(32))
    assert session_row(root, "s0")["completions"] == 1


@CALLERS
def test_a_dropped_session_goes_on_where_it_was(root, caller):
    with StoreWriter(root, max_sessions=2) as w:
        w.record_completion(completion("back", prompt_tokens=5))
        for n in range(6):
            w.flush()
            record(w, completion(f"other{n}"), caller)
        again = record(w, completion("back", prompt_tokens=7), caller)
        w.register_session("back", task_id="t-back")
    assert again["seq"] == 1
    row = session_row(root, "back")
    assert (row["completions"], row["prompt_tokens"], row["task_id"]) == (2, 12, "t-back")


@CALLERS
def test_a_registered_session_keeps_its_row_when_its_first_call_comes_after_a_restart(root, caller):
    with StoreWriter(root) as w:
        w.register_session("reg", task_id="t-reg", harness="codex")
    with StoreWriter(root) as w:
        assert record(w, completion("reg"), caller)["seq"] == 0
    row = session_row(root, "reg")
    assert (row["completions"], row["task_id"], row["harness"]) == (1, "t-reg", "codex")


def migrated_calls_without_a_row(root, sid="old", calls=3):
    """A version-2 store migrated: `calls` calls of `sid` in one part and no row of the session (a writer
    of that version killed before it saved the row), so the table holds its calls and `sessions` nothing."""
    rows = [{**completion(sid), "seq": seq, "completion_id": f"c-{seq}", "finished_at": datetime.now(UTC)}
            for seq in range(calls)]
    directory = root / "completions" / f"session_id={sid}"
    directory.mkdir(parents=True)
    pq.write_table(rows_to_table("completions", rows), directory / f"part-{calls}.parquet")
    (root / "log").mkdir()
    (root / "VERSION").write_text("2\n")
    migrate_store(root)
    assert table_calls(root) == {sid: list(range(calls))} and read_sessions(root, [sid]).num_rows == 0


@CALLERS
def test_a_session_with_committed_calls_but_no_session_row_goes_on_after_them(root, caller):
    migrated_calls_without_a_row(root)
    with StoreWriter(root) as w:
        assert record(w, completion("old"), caller)["seq"] == 3
    assert session_row(root, "old")["completions"] == 4
    assert table_calls(root) == {"old": [0, 1, 2, 3]}


def test_the_writer_knows_a_session_whose_calls_only_the_table_holds(root):
    """has_session: what the gateway answers a close or an outcome of the session with (404 when False)."""
    migrated_calls_without_a_row(root)
    with StoreWriter(root) as w:
        assert w.has_session("old") and not w.has_session("never-seen")


def test_concurrent_writes_with_a_tiny_cache_keep_every_seq(root):
    sessions, per_thread = [f"c{n}" for n in range(6)], 15
    with StoreWriter(root, max_sessions=2) as w:
        def work(sid: str) -> None:
            for _ in range(per_thread):
                w.record_completion(completion(sid))
                w.record_completion(completion("shared"))
        threads = [threading.Thread(target=work, args=(sid,)) for sid in sessions]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    with connect(root) as con:
        seqs = defaultdict(list)
        for sid, seq in con.execute("SELECT session_id, seq FROM completions ORDER BY seq").fetchall():
            seqs[sid].append(seq)
    assert seqs["shared"] == list(range(per_thread * len(sessions)))
    assert all(seqs[sid] == list(range(per_thread)) for sid in sessions)
    assert table_calls(root) == dict(seqs)  # all committed by the close, each once
    assert session_row(root, "shared")["completions"] == per_thread * len(sessions)


@pytest.mark.parametrize("alone", [False, True], ids=["committer", "written-on-the-loop"])
def test_event_loop_callers_and_threads_keep_every_seq(root, alone):
    """The loop's fast path (encode on the loop, woken by the committer, or written right there when
    the caller says it is alone) and the thread path share sessions: parallel calls of one session,
    sessions loaded and evicted under a tiny cache."""
    sessions, per_caller = [f"c{n}" for n in range(6)], 12

    async def loop_caller(sid: str) -> None:
        for _ in range(per_caller):
            await w.record_completion_async(completion(sid), alone=alone)
            await w.record_completion_async(completion("shared"), alone=alone)

    def thread_caller() -> None:
        for _ in range(per_caller):
            w.record_completion(completion("shared"))

    async def main() -> None:
        await asyncio.gather(*(loop_caller(sid) for sid in sessions), asyncio.to_thread(thread_caller))

    with StoreWriter(root, max_sessions=3) as w:
        asyncio.run(main())
    with connect(root) as con:
        seqs = defaultdict(list)
        for sid, seq in con.execute("SELECT session_id, seq FROM completions ORDER BY seq").fetchall():
            seqs[sid].append(seq)
    assert seqs["shared"] == list(range(per_caller * (len(sessions) + 1)))
    assert all(seqs[sid] == list(range(per_caller)) for sid in sessions)
    assert table_calls(root) == dict(seqs)
    assert session_row(root, "shared")["completions"] == per_caller * (len(sessions) + 1)


@pytest.mark.parametrize("tokens", ["many", 2**70], ids=["text", "past-int64"])  # 2**70: Arrow's OverflowError
def test_a_row_that_does_not_fit_fails_alone_in_its_batch(writer, root, tokens):
    async def batch() -> list:
        for sid in ("s1", "s2", "s3"):  # cached, so each call takes the loop's fast path
            await writer.record_completion_async(completion(sid))
        return await asyncio.gather(writer.record_completion_async(completion("s1")),
                                    writer.record_completion_async(completion("s2", prompt_tokens=tokens)),
                                    writer.record_completion_async(completion("s3")), return_exceptions=True)

    first, misfit, third = asyncio.run(batch())
    assert (first["seq"], third["seq"]) == (1, 1)
    assert isinstance(misfit, ValueError) and "prompt_tokens" in str(misfit)
    assert writer.record_completion(completion("s2"))["seq"] == 1  # its seq was given back
    assert [r["seq"] for r in log_rows(root, "s2").to_pylist()] == [0, 1]


def test_a_session_names_a_bounded_number_of_refused_hosts(writer):
    """However many hosts a harness tries, its row stays small: the first ones by name, the rest counted."""
    for n in range(MAX_REFUSED_HOSTS + 10):
        writer.note_refused("s1", f"host-{n}.example")
    writer.note_refused("s1", "host-0.example")
    refused = json.loads(writer.close_session("s1")["refused_hosts_json"])
    assert len(refused) == MAX_REFUSED_HOSTS + 1 and refused[OTHER_HOSTS] == 10 and refused["host-0.example"] == 2


def log_files(root):
    return sorted(path.name for path in (root / "log").glob("*.jsonl"))


def test_a_log_segment_whose_rows_the_table_holds_is_deleted_without_waiting_to_fill(root):
    with StoreWriter(root) as writer:
        for _ in range(50):
            writer.record_completion(completion("s1"))
        writer.record_completion(completion("s2"))
        writer.close_session("s1")
        assert len(log_files(root)) == 1  # s2's row is not committed yet: its segment stays whole
        writer.close_session("s2")
        assert log_files(root) == []  # the table holds every row: the live segment was retired and dropped
        writer.record_completion(completion("s3"))
        assert len(log_files(root)) == 1  # the next call starts a new segment
    assert StoreReader(root).completions("s1").num_rows == 50


def test_segments_rotate_and_each_goes_once_the_table_holds_its_rows(root):
    with StoreWriter(root, segment_bytes=2048) as writer:
        for _ in range(30):
            writer.record_completion(completion("s1"))
        writer.record_completion(completion("s2"))
        assert len(log_files(root)) > 2
        writer.close_session("s1")
        assert len(log_files(root)) == 1  # the segment holding s2's uncommitted call
        assert table_calls(root) == {"s1": list(range(30))}
    assert log_names(root) == [] and table_calls(root) == {"s1": list(range(30)), "s2": [0]}


def test_a_store_at_rest_holds_each_call_once(root):
    with StoreWriter(root) as writer:
        for _ in range(3):
            writer.record_completion(completion("closed"))
        writer.record_completion(completion("open"))
        writer.close_session("closed")
        assert len(log_files(root)) == 1  # the open session's call is not committed yet
    assert log_names(root) == []  # the writer's close committed it: no segment, no live rows
    assert table_calls(root) == {"closed": [0, 1, 2], "open": [0]}
    assert committed_seqs(open_table(root, "completions")) == {"closed": 3, "open": 1}
    reader = StoreReader(root)
    assert [reader.completions(sid).num_rows for sid in ("closed", "open")] == [3, 1]
    assert [(row["session_id"], row["completions"]) for row in reader.sessions()] == [("closed", 3), ("open", 1)]
    assert committed_row(root, "open")["completions"] == 1


# the live session rows: between two commits of a session, its current row is in its writer's live file


def test_a_row_changed_after_its_commit_shows_through_the_live_file(writer, root):
    writer.record_completion(completion())
    writer.close_session("s1")
    writer.flush()
    assert live_files(root) == []  # the committed row is current: no live copy
    writer.note_unrecorded("s1", "probe")
    writer.record_completion(completion(prompt_tokens=4))
    writer.flush()
    [live] = live_files(root)
    [segment] = log_files(root)
    assert live.name == segment.split("-")[0] + ".sessions.parquet"  # the writer's one live file
    old = committed_row(root)
    assert (old["status"], old["completions"], old["unrecorded_json"]) == ("closed", 1, None)
    new = session_row(root)
    assert (new["status"], new["completions"], new["prompt_tokens"]) == ("open", 2, 7)
    assert json.loads(new["unrecorded_json"]) == {"probe": 1} and new["revision"] > old["revision"]
    assert StoreReader(root).session("s1") == new
    sql = "SELECT status, completions, revision FROM sessions WHERE session_id = 's1'"
    assert connect(root).execute(sql).fetchall() == [("open", 2, new["revision"])]
    assert scan(root, "sessions").collect()["completions"].to_list() == [2]


def session_copy(revision: int, completions: int) -> dict:
    return {"session_id": "s1", "status": "open", "completions": completions, "prompt_tokens": 0,
            "completion_tokens": 0, "revision": revision}


def test_of_a_sessions_copies_the_highest_revision_is_current(root):
    StoreWriter(root).close()
    replace(root, "sessions", rows_to_table("sessions", [session_copy(5, 5)]), sql_in("session_id", ["s1"]), "test")
    write_live(root, "aaaa", [session_copy(3, 3)])  # an older copy, left by a writer that committed since
    write_live(root, "bbbb", [session_copy(7, 7)])
    sql = "SELECT completions FROM sessions"

    def everyone_reads() -> list[int]:
        return [session_row(root)["completions"], StoreReader(root).session("s1")["completions"],
                connect(root).execute(sql).fetchone()[0], scan(root, "sessions").collect()["completions"].item()]

    assert everyone_reads() == [7] * 4
    (root / "log" / "bbbb.sessions.parquet").unlink()
    assert everyone_reads() == [5] * 4  # the committed row beats the stale live one


def test_readers_never_miss_a_session_row_or_see_it_go_back_while_it_is_committed(writer, root):
    seen, errors, done = [], [], threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                rows = read_sessions(root, ["s1"]).to_pylist()
            except Exception as error:  # reported below
                errors.append(error)
                return
            seen.append(rows[0]["completions"] if rows else None)

    writer.register_session("s1", task_id="t")
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(40):
            writer.record_completion(completion())
            if n % 3 == 0:
                writer.flush()
            if n % 4 == 0:
                writer.compact_idle(0)
    finally:
        done.set()
        reader.join()
    assert errors == [] and seen and None not in seen
    assert seen == sorted(seen)


def test_the_live_file_goes_when_the_writer_closes(root):
    writer = StoreWriter(root)
    writer.register_session("s1", task_id="t")
    writer.record_completion(completion("s2"))
    writer.flush()
    assert len(live_files(root)) == 1
    writer.close()
    assert live_files(root) == [] and log_names(root) == []
    assert committed_row(root)["task_id"] == "t" and committed_row(root, "s2")["completions"] == 1


def test_a_writer_taken_over_after_stalling_records_nothing_more(root):
    """A taker removes a dead writer's heartbeat; a writer that only stalled finds it gone at its next beat
    and refuses calls from then on: the sessions it had may have new owners."""
    with StoreWriter(root) as writer:
        writer.record_completion(completion("s1"))
        (root / "writers" / f"{writer.writer_id}.json").unlink()

        def refused() -> bool:
            try:
                writer.record_completion(completion("s1"))
            except StoreError as error:
                return "taken over" in str(error)
            return False

        assert wait_for(refused, timeout=15)
