import asyncio
import json
import re
import shutil
import threading
from collections import defaultdict
from datetime import UTC, datetime

import pyarrow.parquet as pq
import pytest
from store_rows import completion, record_files, snapshot
from tracetap.store import InvalidSessionId, StoreReader, StoreWriter, connect
from tracetap.store.files import StoreError
from tracetap.store.log_reading import log_rows
from tracetap.store.paths import log_segments, session_dir, session_file
from tracetap.store.reading import read_session
from tracetap.store.schema import COMPLETIONS, MAX_REFUSED_HOSTS, OTHER_HOSTS, SCHEMA_VERSION


def session_row(root, sid="s1"):
    return pq.read_table(session_file(root, sid)).to_pylist()[0]


def test_open_creates_layout_and_version(root):
    with StoreWriter(root):
        pass
    assert (root / "VERSION").read_text().strip() == str(SCHEMA_VERSION)
    assert {"completions", "sessions"} <= {p.name for p in root.iterdir()}


def test_newer_store_is_refused(root):
    root.mkdir()
    (root / "VERSION").write_text(f"{SCHEMA_VERSION + 1}\n")
    with pytest.raises(StoreError, match="schema version"):
        StoreWriter(root)


def test_second_writer_on_one_store_is_refused(writer, root):
    with pytest.raises(StoreError, match="already open"):
        StoreWriter(root)


def test_record_fills_ids_and_logs_one_whole_line(writer, root):
    stored = writer.record_completion(completion(created_at=datetime(2026, 1, 1, tzinfo=UTC)))
    assert stored["seq"] == 0 and re.fullmatch(r"cmpl-[0-9a-f]{24}", stored["completion_id"])
    assert stored["finished_at"].tzinfo is not None and set(stored) == set(COMPLETIONS.names)
    assert not session_dir(root, "completions", "s1").exists()  # no per-call file: one log line
    [segment] = log_segments(root)
    assert segment.read_bytes().count(b"\n") == 1
    [line] = log_rows(root).to_pylist()
    assert line["prompt_suffix_ids"] == [1, 2, 3] and line["prompt_token_ids"] is None  # compact form
    assert read_session(session_dir(root, "completions", "s1")).to_pylist() == [stored]


def test_every_file_is_complete_and_no_temp_is_left(writer, root):
    for i in range(20):
        writer.record_completion(completion(f"s{i % 3}", completion_id=f"c-{i}"))
    writer.flush()
    files = [p for p in root.rglob("*") if p.is_file() and p.name not in ("VERSION",)]
    assert not [p for p in files if p.name.endswith(".tmp")]
    data = [p for p in files if p.suffix == ".parquet"]
    assert len(data) == 3  # the session rows; the calls are in the log
    assert all(pq.read_table(p).num_rows == 1 for p in data)
    assert log_rows(root).num_rows == 20


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
    assert session_row(root)["completions"] == 0
    writer.record_completion(completion(task_id="other", metadata_json='{"harness": "codex"}'))
    closed = writer.close_session("s1")
    row = session_row(root)
    assert row == closed
    assert (row["task_id"], row["harness"], row["status"]) == ("t1", "claude_code", "closed")
    assert row["completions"] == 1
    assert json.loads(row["metadata_json"]) == {"sample": 2}
    assert [p.name for p in session_dir(root, "completions", "s1").glob("*.parquet")] == ["part-1.parquet"]
    writer.record_completion(completion())
    writer.flush()
    assert session_row(root)["status"] == "open"


def test_stale_session_row_is_recounted_on_load(root):
    with StoreWriter(root) as w:
        w.record_completion(completion(task_id="t"))
        w.flush()
        shutil.copy(session_file(root, "s1"), root / "old-row")
        w.record_completion(completion(status="timeout"))
        w.record_completion(completion(prompt_tokens=7))
    shutil.copy(root / "old-row", session_file(root, "s1"))  # as if the last row writes were lost
    with StoreWriter(root) as w:
        w.record_completion(completion())
    row = session_row(root)
    assert (row["completions"], row["prompt_tokens"], row["task_id"]) == (4, 3 + 7 + 3, "t")
    assert json.loads(row["upstream_failures_json"])["timeout"] == 1


def test_compact_idle_only_touches_idle_sessions_with_new_files(writer, root):
    writer.record_completion(completion("a"))
    writer.record_completion(completion("b"))
    assert writer.compact_idle(3600) == []
    assert sorted(writer.compact_idle(0)) == ["a", "b"]
    assert writer.compact_idle(0) == []
    assert [p.name for p in session_dir(root, "completions", "a").glob("*.parquet")] == ["part-1.parquet"]


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
        w.flush()  # rows on disk: every old state may now go
        w.record_completion(completion("last"))
        assert w.cached_sessions == 8
    dropped = session_dir(root, "completions", "s0")
    assert [p.name for p in dropped.glob("*.parquet")] == ["part-1.parquet"]  # compacted when dropped
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


@CALLERS
def test_a_session_with_files_but_no_session_row_goes_on_after_them(root, caller):
    StoreWriter(root).close()
    record_files(root, 3, "old")  # completions as a v1 writer left them, no summary row
    with StoreWriter(root) as w:
        assert record(w, completion("old"), caller)["seq"] == 3
    assert session_row(root, "old")["completions"] == 4


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


def test_a_log_segment_whose_rows_parts_hold_is_deleted_without_waiting_to_fill(root):
    with StoreWriter(root, retire_after=0) as writer:
        for _ in range(50):
            writer.record_completion(completion("s1"))
        writer.record_completion(completion("s2"))
        writer.close_session("s1")
        assert len(log_files(root)) == 1  # s2's row is in no part yet: its segment stays whole
        writer.close_session("s2")
        assert log_files(root) == []  # every row is in parts: the live segment was retired and dropped
        writer.record_completion(completion("s3"))
        assert len(log_files(root)) == 1  # the next call starts a new segment
    assert StoreReader(root).completions("s1").num_rows == 50


def test_a_store_at_rest_holds_each_call_once(root):
    with StoreWriter(root) as writer:
        for _ in range(3):
            writer.record_completion(completion("closed"))
        writer.record_completion(completion("open"))
        writer.close_session("closed")
        assert len(log_files(root)) == 1  # the open session's row is in no part yet
    assert log_files(root) == []  # the writer's close put it in one
    reader = StoreReader(root)
    assert [reader.completions(sid).num_rows for sid in ("closed", "open")] == [3, 1]
