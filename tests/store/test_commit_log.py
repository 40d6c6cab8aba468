"""The group-commit log: exact round trips, torn tails, segment rotation and deletion once the completions
table holds their rows, recovery."""

from __future__ import annotations

import asyncio
import math
import random
import struct
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta

import pytest
from deltalake import DeltaTable
from store_rows import abandoned_writer_store, completion
from tracetap.store import StoreWriter, connect, scan
from tracetap.store.commit_log import encode_line
from tracetap.store.compaction import commit_logged
from tracetap.store.delta import committed_seqs, open_table, storage_schema
from tracetap.store.log_reading import log_rows
from tracetap.store.owners import claim
from tracetap.store.paths import live_files, log_segments
from tracetap.store.reading import read_completions


def float32s(rng: random.Random, count: int) -> list[float]:
    """Random float32 values (as Python floats) over the whole exponent range, signs, subnormals."""
    values = [struct.unpack("f", struct.pack("I", rng.getrandbits(32)))[0] for _ in range(count)]
    return [v for v in values if math.isfinite(v)] + [-0.0, 1.401298464324817e-45, -3.4028234663852886e38]


def awkward_row(rng: random.Random) -> dict:
    """A row with everything the encoding must keep exactly."""
    when = datetime(2026, 3, 1, 12, 0, 0, 123457, tzinfo=UTC)
    return completion(
        prompt_token_ids=[0, 2**31 - 1, -(2**31), 7], completion_token_ids=[rng.randrange(2**31) for _ in range(9)],
        logprobs=float32s(rng, 200) + [rng.uniform(-20, 0) for _ in range(200)] + [-math.inf],
        top_logprobs=[[{"token_id": 5, "token": "é\u2028\"\\", "logprob": -0.1}]],
        tool_calls=[{"id": "t1", "name": "ls", "arguments": '{"p": "/tmp\\n"}'}],
        created_at=when, finished_at=when + timedelta(microseconds=1), upstream_ms=1 / 3,
        request_json='{"messages": ["\\ud83d\\ude00 ☃"]}', metadata_json=None, http_status=200)


def test_log_rows_equal_table_rows_in_python_and_sql(tmp_path):
    """The same rows read from the log and, committed, from the Delta table: equal in every reader."""
    rng = random.Random(11)
    committed = tmp_path / "committed"
    StoreWriter(committed).close()
    with StoreWriter(tmp_path / "log") as writer:  # read while open: its close would commit the rows
        for _ in range(3):
            writer.record_completion(awkward_row(rng))
        logged = log_rows(tmp_path / "log")  # the stored (compact) form
        assert commit_logged(committed, logged, "test") == {"s1": 3}
        assert log_rows(committed).num_rows == 0
        in_table = DeltaTable(str(committed / "completions")).to_pyarrow_table().select(logged.column_names)
        assert in_table.cast(storage_schema("completions")).equals(logged)
        for_python = [read_completions(store, ["s1"])["s1"] for store in (tmp_path / "log", committed)]
        assert for_python[0].equals(for_python[1]) and for_python[0].column("seq").to_pylist() == [0, 1, 2]
        sql = "SELECT * EXCLUDE (chain_index, side_call) FROM completions ORDER BY seq"
        assert connect(tmp_path / "log").sql(sql).to_arrow_table() == connect(committed).sql(sql).to_arrow_table()


def test_float32_values_survive_json(tmp_path):
    rng = random.Random(3)
    values = float32s(rng, 5000)
    with StoreWriter(tmp_path) as writer:  # read while open: its close would compact the row
        writer.record_completion(completion(logprobs=values))
        assert log_rows(tmp_path).column("logprobs")[0].as_py() == values
        got = connect(tmp_path).execute("SELECT logprobs FROM completions").fetchone()[0]
    assert got == values
    assert connect(tmp_path).execute("SELECT logprobs FROM completions").fetchone()[0] == values  # committed


def test_rows_that_json_cannot_hold_are_refused_before_the_log(writer, root):
    with pytest.raises(ValueError, match="column"):
        writer.record_completion(completion(logprobs=[object()]))
    assert log_rows(root).num_rows == 0


def logged_line(seq: int) -> bytes:
    return encode_line({**completion(), "seq": seq, "completion_id": f"c-{seq}",
                       "finished_at": datetime(2026, 1, 1, tzinfo=UTC)})


LINE = logged_line(1)


@pytest.mark.parametrize("cut", [1, 20, len(LINE) // 2, len(LINE) - 3, len(LINE) - 2])
def test_a_torn_tail_is_never_visible_and_a_restart_drops_it(root, cut):
    [first] = abandoned_writer_store(root, [completion()])  # a crashed writer: its row only in the log
    [segment] = log_segments(root)
    with open(segment, "ab") as handle:
        handle.write(LINE[:cut])  # a batch cut by the crash: seq 1 was never acknowledged
    assert [r["completion_id"] for r in log_rows(root).to_pylist()] == [first["completion_id"]]
    con = connect(root)
    assert con.sql("SELECT completion_id FROM completions").fetchall() == [(first["completion_id"],)]
    assert scan(root, "completions").collect()["completion_id"].to_list() == [first["completion_id"]]
    with StoreWriter(root) as writer:
        assert log_segments(root) == []  # recovered: its row committed, the torn tail dropped with its segment
        assert committed_seqs(open_table(root, "completions")) == {"s1": 1}
        assert writer.record_completion(completion())["seq"] == 1
    assert con.sql("SELECT seq FROM completions ORDER BY seq").fetchall() == [(0,), (1,)]


def test_a_whole_last_line_without_its_newline_is_a_row(root):
    with StoreWriter(root):
        pass
    root.joinpath("log").mkdir()
    (root / "log" / "0dead-000000.jsonl").write_bytes(logged_line(0).rstrip(b"\n"))
    assert connect(root).execute("SELECT count(*) FROM completions").fetchone() == (1,)
    assert read_completions(root, ["s1"])["s1"].num_rows == 1


def test_segments_rotate_and_go_once_the_table_holds_them(root):
    with StoreWriter(root, segment_bytes=2000) as writer:
        for _ in range(10):
            writer.record_completion(completion("kept-open"))
            writer.record_completion(completion("closed"))
        assert len(log_segments(root)) > 3
        writer.close_session("closed")
        assert len(log_segments(root)) > 3  # every segment still holds rows of kept-open
        assert committed_seqs(open_table(root, "completions")) == {"closed": 10}
        writer.close_session("kept-open")
        assert log_segments(root) == []  # the table holds every row: all go at once, the live one too
        writer.record_completion(completion("kept-open"))
        assert len(log_segments(root)) == 1
    rows = connect(root).sql("SELECT session_id, count(*) FROM completions GROUP BY ALL ORDER BY 1").fetchall()
    assert rows == [("closed", 10), ("kept-open", 11)]


def test_a_writer_that_closed_leaves_an_empty_log_and_each_call_once_in_the_table(root):
    writer = StoreWriter(root, segment_bytes=2000)
    for n in range(6):
        writer.record_completion(completion(f"s{n % 2}"))
    writer.close_session("s0")
    writer.record_completion(completion("s0"))
    writer.flush()
    assert log_segments(root) and live_files(root)  # s1's calls, s0's last one, their rows: uncommitted
    writer.close()
    assert not [path.name for path in (root / "log").iterdir()]
    table = DeltaTable(str(root / "completions")).to_pyarrow_table(columns=["session_id", "seq"])
    keys = sorted(zip(table["session_id"].to_pylist(), table["seq"].to_pylist(), strict=True))
    assert keys == [("s0", seq) for seq in range(4)] + [("s1", seq) for seq in range(3)]
    sessions = DeltaTable(str(root / "sessions")).to_pyarrow_table(columns=["session_id", "completions"])
    assert sorted(sessions.to_pylist(), key=lambda row: row["session_id"]) == [
        {"session_id": "s0", "completions": 4}, {"session_id": "s1", "completions": 3}]
    assert connect(root).sql("SELECT count(*), count(DISTINCT (session_id, seq)) FROM completions").fetchall() == [
        (7, 7)]


def test_concurrent_calls_share_batches_and_keep_session_order(root):
    with StoreWriter(root) as writer:
        def work(n: int) -> None:
            for _ in range(20):
                writer.record_completion(completion(f"c{n % 4}"))

        threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        [segment] = log_segments(root)
        lines = segment.read_bytes().splitlines()
        assert len(lines) == 320
        for sid in ("c0", "c1", "c2", "c3"):  # a session's rows reach the log in seq order
            seqs = [row["seq"] for row in log_rows(root, sid).to_pylist()]
            assert seqs == list(range(80))


FILE_LIMIT_SCRIPT = """
import asyncio, resource, signal, sys
from tracetap.store import StoreError, StoreWriter
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, write() fails with EFBIG instead

async def on_loop(row):  # the gateway's path: encoded on the loop, written by the committer or, alone, right there
    return await writer.record_completion_async(row, alone=sys.argv[3] == "loop-alone")

record = (lambda row: asyncio.run(on_loop(row))) if sys.argv[3].startswith("loop") else None
with StoreWriter(sys.argv[1]) as writer:
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
    outcomes = []
    for n in range(3):
        row = {"session_id": "s1", "status": "ok", "error": "x" * 700, "completion_id": f"c-{n}"}
        try:
            outcomes.append((record or writer.record_completion)(row)["seq"])
        except StoreError as error:
            outcomes.append(str(error))
    print(outcomes, flush=True)
    sys.stdin.read()  # the parent reads the log while this writer is open, then closes our stdin
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))  # for the close
"""


@pytest.mark.parametrize("caller", ["thread", "loop", "loop-alone"])
def test_a_failed_write_leaves_no_line_of_its_batch_and_the_next_call_goes_on(root, caller):
    """A real write failure: a file size limit (RLIMIT_FSIZE) that the second row crosses mid-line. The log
    is read while the child's writer is open (its close commits the rows to the table)."""
    line = len(encode_line({**completion(), "error": "x" * 700, "completion_id": "c-0", "seq": 0,
                           "finished_at": datetime(2026, 1, 1, tzinfo=UTC)}))
    args = [sys.executable, "-c", FILE_LIMIT_SCRIPT, str(root), str(line + line // 2), caller]
    with subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as child:  # leaving closes its stdin: the child's writer closes
        printed = child.stdout.readline()
        assert printed, child.stderr.read()
        outcomes = eval(printed)  # a list of seqs and error messages, printed by the child
        assert outcomes[0] == 0 and "could not write the log" in outcomes[1] and outcomes[2] == 1
        first, second = log_segments(root)  # the failed batch retired the first segment
        assert first.read_bytes().count(b"\n") == 1 and first.read_bytes().endswith(b"\n")  # cut back: no torn tail
        rows = log_rows(root).to_pylist()
        assert [(r["seq"], r["completion_id"]) for r in rows] == [(0, "c-0"), (1, "c-2")]
        child.stdin.close()
        assert child.wait(timeout=60) == 0, child.stderr.read()
    keys = connect(root).sql("SELECT seq, completion_id FROM completions ORDER BY seq").fetchall()
    assert keys == [(0, "c-0"), (1, "c-2")]  # the close compacted what the log held, and nothing else



@pytest.mark.parametrize("from_loop", [False, True], ids=["thread", "event-loop"])
def test_recovery_stops_at_a_gap_and_keeps_what_lies_past_it_visible(root, from_loop):
    StoreWriter(root).close()
    (root / "log").mkdir()
    (root / "log" / "0dead-000000.jsonl").write_bytes(logged_line(0) + logged_line(2))  # seq 1 never written
    claim(root, "s1", "0dead")  # its writer claimed it first, and died without a heartbeat
    with StoreWriter(root) as writer:
        assert committed_seqs(open_table(root, "completions")) == {"s1": 1}
        assert [p.name for p in log_segments(root)] == ["0dead-000000.jsonl"]  # seq 2 is only there
        row = asyncio.run(writer.record_completion_async(completion())) if from_loop else \
            writer.record_completion(completion())
        assert row["seq"] == 3
    assert connect(root).execute("SELECT seq FROM completions ORDER BY seq").fetchall() == [(0,), (2,), (3,)]


def test_a_lone_callers_line_is_written_in_its_own_thread(root):
    """`alone`: the event loop writes and syncs its line itself when the log is idle (no thread hand-off)."""
    written_by = []
    with StoreWriter(root) as writer:
        real_write = writer._log._write

        def write(data: bytes):
            written_by.append(threading.get_ident())
            return real_write(data)

        writer._log._write = write
        rows = [asyncio.run(writer.record_completion_async(completion(), alone=alone)) for alone in (True, True, False)]
        assert [row["seq"] for row in log_rows(root).to_pylist()] == [0, 1, 2]
    assert [row["seq"] for row in rows] == [0, 1, 2]
    here = threading.get_ident()
    assert written_by[:2] == [here, here] and written_by[2] != here  # not alone: the committer wrote it


def test_a_session_only_in_the_log_past_a_gap_goes_on_after_it_from_the_event_loop(root):
    """Nothing of it can be compacted (seq 0 is missing), so its rows stay only in the log; its next call,
    recorded the gateway's way, still follows them."""
    StoreWriter(root).close()
    (root / "log").mkdir()
    (root / "log" / "0dead-000000.jsonl").write_bytes(logged_line(1) + logged_line(2))
    claim(root, "s1", "0dead")  # its writer claimed it first, and died without a heartbeat
    with StoreWriter(root) as writer:
        assert asyncio.run(writer.record_completion_async(completion(), alone=True))["seq"] == 3
    assert connect(root).execute("SELECT seq FROM completions ORDER BY seq").fetchall() == [(1,), (2,), (3,)]
