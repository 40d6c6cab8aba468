import os
import shutil
import threading
import time

import duckdb
import pytest
from store_rows import abandoned_writer_store, completion, record_files, snapshot
from tracetap.store import StoreWriter, connect, scan
from tracetap.store.compaction import compact_session, compact_store
from tracetap.store.files import write_parquet_atomic
from tracetap.store.paths import session_dir
from tracetap.store.reading import read_session
from tracetap.store.snapshot import visible
from tracetap.store.tables import rows_to_table


def names(root, sid="s1"):
    return sorted(p.name for p in session_dir(root, "completions", sid).glob("*.parquet"))


def seqs(root, sid="s1"):
    sql = "SELECT seq FROM completions WHERE session_id = ? ORDER BY seq"
    return [r[0] for r in connect(root).execute(sql, [sid]).fetchall()]


def record(writer, count, sid="s1"):
    stored = [writer.record_completion(completion(sid, prompt_token_ids=[i, i + 1])) for i in range(count)]
    writer.flush()
    return stored


def test_compaction_keeps_every_row_in_order(writer, root):
    stored = record(writer, 7)
    assert compact_session(root, "s1") == 7
    assert names(root) == ["part-7.parquet"]
    part = read_session(session_dir(root, "completions", "s1")).to_pylist()
    assert part == stored


def test_compaction_is_idempotent(writer, root):
    record(writer, 3)
    compact_session(root, "s1")
    before = snapshot(root)
    assert compact_session(root, "s1") == 0
    assert snapshot(root) == before


def test_compaction_folds_the_old_part_into_the_new_one(writer, root):
    record(writer, 3)
    compact_session(root, "s1")
    record_files(root, 2)
    assert [n[:9] for n in names(root)] == ["00000003-", "00000004-", "part-3.pa"]
    assert compact_session(root, "s1") == 2
    assert names(root) == ["part-5.parquet"]
    assert seqs(root) == [0, 1, 2, 3, 4]


def test_compaction_stops_at_a_gap(writer, root):
    record_files(root, 4)
    directory = session_dir(root, "completions", "s1")
    held = next(directory.glob("00000002-*.parquet"))
    held.rename(directory / f".{held.name}.in-flight.tmp")  # seq 2 is still being written
    assert compact_session(root, "s1") == 2
    assert names(root)[-1] == "part-2.parquet" and names(root)[0].startswith("00000003-")
    assert seqs(root) == [0, 1, 3]
    (directory / f".{held.name}.in-flight.tmp").rename(held)
    assert seqs(root) == [0, 1, 2, 3]
    assert compact_session(root, "s1") == 2 and names(root) == ["part-4.parquet"]


def crash_after_rename(writer, root):
    """The state a crash leaves between writing part-5 and deleting what it merged (and an older part)."""
    record_files(root, 3)  # a v1 store's files: the writer has not seen this session
    compact_session(root, "s1")  # part-3
    record_files(root, 2)
    directory = session_dir(root, "completions", "s1")
    saved = root.parent / "saved"
    shutil.copytree(directory, saved)
    compact_session(root, "s1")  # part-5
    for path in saved.glob("*.parquet"):
        shutil.copy(path, directory / path.name)
    return directory


def test_readers_are_right_after_a_crash_between_part_and_deletes(writer, root):
    directory = crash_after_rename(writer, root)
    assert names(root)[-2:] == ["part-3.parquet", "part-5.parquet"] and len(names(root)) == 4
    assert seqs(root) == [0, 1, 2, 3, 4]
    assert scan(root, "completions").select("seq").collect()["seq"].sort().to_list() == [0, 1, 2, 3, 4]
    assert [os.path.basename(p) for p in visible(directory).files] == ["part-5.parquet"]
    assert writer.record_completion(completion())["seq"] == 5
    assert compact_session(root, "s1") == 1
    assert names(root) == ["part-6.parquet"] and seqs(root) == list(range(6))


def test_a_new_writer_continues_after_a_crash_state(writer, root):
    crash_after_rename(writer, root)
    writer.close()
    with StoreWriter(root) as again:
        assert again.record_completion(completion())["seq"] == 5


def test_appends_during_compaction_are_never_lost_or_doubled(writer, root):
    stop, errors, observed = threading.Event(), [], []

    def append():
        for i in range(60):
            deadline = time.monotonic() + 10
            while i % 10 == 0 and len(observed) < i // 10 and time.monotonic() < deadline:
                time.sleep(0.001)  # group-commit appends are fast: let reads land among them
            writer.record_completion(completion(prompt_token_ids=[i]))
        stop.set()

    def compact():
        while not stop.is_set():
            try:
                compact_session(root, "s1")
            except Exception as exc:  # compaction must cope with writes landing while it runs
                errors.append(repr(exc))
                return

    def read():
        con = connect(root)
        while not stop.is_set():
            try:
                got = [r[0] for r in con.execute("SELECT seq FROM completions").fetchall()]
            except duckdb.IOException:  # a file deleted between listing and opening: retry
                continue
            observed.append(got)
            if sorted(got) != list(range(len(got))):
                errors.append(sorted(got))

    threads = [threading.Thread(target=f) for f in (append, compact, read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    compact_session(root, "s1")
    assert errors == []
    assert len(observed) >= 5
    assert seqs(root) == list(range(60))
    assert names(root) == ["part-60.parquet"]


def test_compaction_refuses_inputs_that_do_not_line_up(root):
    # seqs 0 and 1 in the log of a crashed writer (an open one's close would compact the odd file too)
    abandoned_writer_store(root, [completion(), completion()])
    directory = session_dir(root, "completions", "s1")
    write_parquet_atomic(directory / "00000002-odd.parquet", rows_to_table("completions", [
        completion(seq=7, completion_id="odd")]))
    before = names(root)
    with pytest.raises(RuntimeError, match="seqs"):
        compact_session(root, "s1")
    assert names(root) == before


def test_stale_temp_files_are_swept_and_fresh_ones_kept(writer, root):
    record_files(root, 1)
    directory = session_dir(root, "completions", "s1")
    old, fresh = directory / ".a.parquet.1.tmp", directory / ".b.parquet.2.tmp"
    old.write_bytes(b"partial")
    fresh.write_bytes(b"partial")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    compact_session(root, "s1")
    assert not old.exists() and fresh.exists()
    assert seqs(root) == [0]


def test_compact_store_reports_what_it_merged(writer, root):
    assert compact_store(root) == {}
    record(writer, 2, "a")
    record(writer, 3, "b")
    assert compact_store(root) == {"a": 2, "b": 3}
    assert compact_store(root) == {}
    assert compact_session(root, "never-seen") == 0


def test_sql_reads_during_a_whole_store_compaction_need_at_most_one_retry(root, monkeypatch):
    """`tracetap compact` over many sessions deletes what it superseded at the end, not session by session:
    a read whose listing a deletion outdates gets the new parts on its one retry."""
    sessions = [f"c{n}" for n in range(60)]
    with StoreWriter(root) as writer:  # its close compacts: every session gets a part
        for sid in sessions:
            record(writer, 2, sid)
    monkeypatch.setattr("tracetap.store.reading.ATTEMPTS", 2)
    counts, errors, done = [], [], threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                counts.append(connect(root).execute("SELECT count(*) FROM completions").fetchone()[0])
            except Exception as error:  # reported below
                errors.append(error)

    with StoreWriter(root) as writer:  # every session: a part plus logged rows, so compaction supersedes a file
        for sid in sessions:
            record(writer, 1, sid)
        reader = threading.Thread(target=read)
        reader.start()
        try:
            assert len(compact_store(root)) == len(sessions)
        finally:
            done.set()
            reader.join()
    assert errors == [] and counts and set(counts) == {3 * len(sessions)}
