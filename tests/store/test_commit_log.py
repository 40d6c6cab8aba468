"""The group-commit log: exact round trips, torn tails, segment rotation and deletion, recovery."""

from __future__ import annotations

import asyncio
import math
import random
import struct
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta

import pyarrow.parquet as pq
import pytest
from store_rows import abandoned_writer_store, completion
from tracetap.store import StoreWriter, connect, scan
from tracetap.store.commit_log import encode_line
from tracetap.store.files import write_parquet_atomic
from tracetap.store.log_reading import log_rows
from tracetap.store.paths import log_segments, session_dir
from tracetap.store.reading import read_session


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


def test_log_rows_equal_parquet_rows_in_python_and_sql(tmp_path):
    rng = random.Random(11)
    parquet = tmp_path / "parquet"
    StoreWriter(parquet).close()
    with StoreWriter(tmp_path / "log") as writer:  # read while open: its close would compact the rows
        for _ in range(3):
            writer.record_completion(awkward_row(rng))
        logged = log_rows(tmp_path / "log")  # the stored (compact) form
        write_parquet_atomic(session_dir(parquet, "completions", "s1") / "part-3.parquet", logged)
        assert logged.equals(pq.read_table(session_dir(parquet, "completions", "s1") / "part-3.parquet"))
        for_python = [read_session(session_dir(store, "completions", "s1")) for store in (tmp_path / "log", parquet)]
        assert for_python[0].equals(for_python[1]) and for_python[0].column("seq").to_pylist() == [0, 1, 2]
        sql = "SELECT * EXCLUDE (chain_index, side_call) FROM completions ORDER BY seq"
        assert connect(tmp_path / "log").sql(sql).to_arrow_table() == connect(parquet).sql(sql).to_arrow_table()


def test_float32_values_survive_json(tmp_path):
    rng = random.Random(3)
    values = float32s(rng, 5000)
    with StoreWriter(tmp_path) as writer:  # read while open: its close would compact the row
        writer.record_completion(completion(logprobs=values))
        assert log_rows(tmp_path).column("logprobs")[0].as_py() == values
        got = connect(tmp_path).execute("SELECT logprobs FROM completions").fetchone()[0]
    assert got == values


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
        assert log_segments(root) == []  # recovered into part-1, torn tail dropped with its segment
        assert writer.record_completion(completion())["seq"] == 1
    assert con.sql("SELECT seq FROM completions ORDER BY seq").fetchall() == [(0,), (1,)]


def test_a_whole_last_line_without_its_newline_is_a_row(root):
    with StoreWriter(root):
        pass
    root.joinpath("log").mkdir()
    (root / "log" / "0dead-000000.jsonl").write_bytes(logged_line(0).rstrip(b"\n"))
    assert connect(root).execute("SELECT count(*) FROM completions").fetchone() == (1,)
    assert read_session(session_dir(root, "completions", "s1")).num_rows == 1


def test_segments_rotate_and_go_once_parts_cover_them(root):
    with StoreWriter(root, segment_bytes=2000, retire_after=0) as writer:
        for _ in range(10):
            writer.record_completion(completion("kept-open"))
            writer.record_completion(completion("closed"))
        assert len(log_segments(root)) > 3
        writer.close_session("closed")
        assert len(log_segments(root)) > 3  # every segment still holds rows of kept-open
        writer.close_session("kept-open")
        remaining = log_segments(root)
        assert len(remaining) <= 1  # only the live segment may stay
        writer.record_completion(completion("kept-open"))
        assert set(log_segments(root)) >= set(remaining)
    rows = connect(root).sql("SELECT session_id, count(*) FROM completions GROUP BY ALL ORDER BY 1").fetchall()
    assert rows == [("closed", 10), ("kept-open", 11)]


def test_what_compaction_supersedes_outlives_its_grace_hidden_and_goes_on_close(root):
    writer = StoreWriter(root, segment_bytes=2000, retire_after=60)
    for _ in range(6):
        writer.record_completion(completion("s1"))
    segments = set(map(str, log_segments(root)))
    assert len(segments) > 1
    writer.close_session("s1")
    writer.record_completion(completion("s1"))
    writer.close_session("s1")  # part-7 supersedes part-6: both parts, and the segments, wait out the grace
    directory = session_dir(root, "completions", "s1")
    assert sorted(p.name for p in directory.glob("*.parquet")) == ["part-6.parquet", "part-7.parquet"]
    assert segments <= {str(p) for p in (root / "log").iterdir()}
    assert connect(root).sql("SELECT count(*), count(DISTINCT seq) FROM completions").fetchall() == [(7, 7)]
    assert len(read_session(directory)) == 7  # readers see the new part only
    writer.close()
    assert [p.name for p in directory.glob("*.parquet")] == ["part-7.parquet"]
    assert segments - {str(p) for p in (root / "log").iterdir()}  # the retired ones are gone


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
    is read while the child's writer is open (its close compacts the rows into a part)."""
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
    with StoreWriter(root) as writer:
        assert [p.name for p in session_dir(root, "completions", "s1").glob("*.parquet")] == ["part-1.parquet"]
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
    with StoreWriter(root) as writer:
        assert asyncio.run(writer.record_completion_async(completion(), alone=True))["seq"] == 3
    assert connect(root).execute("SELECT seq FROM completions ORDER BY seq").fetchall() == [(1,), (2,), (3,)]
