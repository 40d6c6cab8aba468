"""The writer's count of calls answered without a completion row, and stores written before it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from store_rows import abandoned_writer_store, completion
from tracetap.store import StoreReader, StoreWriter, connect, migrate_store, scan
from tracetap.store.files import storage_schema
from tracetap.store.paths import live_files
from tracetap.store.reading import read_sessions
from tracetap.store.schema import SESSIONS
from tracetap.store.tables import rows_to_table


def counts(text):
    return json.loads(text) if text else None


def unrecorded(root, sid):
    """The counts readers see (the session's current row: live or committed)."""
    [row] = read_sessions(root, [sid]).to_pylist()
    return counts(row["unrecorded_json"])


def committed_unrecorded(root, sid):
    """The counts of the session's row in the `sessions` Delta table itself."""
    table = DeltaTable(str(root / "sessions")).to_pyarrow_table()
    [row] = table.filter(pc.field("session_id") == sid).to_pylist()
    return counts(row["unrecorded_json"])


def crashed_writer_calls(root, sid):
    """A call recorded by a writer killed before its live session rows were written (their loss is what
    makes the next writer recount the session's row from its calls)."""
    abandoned_writer_store(root, [completion(sid)])
    for path in live_files(root):
        path.unlink()


def test_counts_are_saved_kept_across_recounts_and_reopen(root):
    with StoreWriter(root) as writer:
        writer.note_unrecorded("s1", "probe")
        writer.note_unrecorded("s1", "probe")
        writer.note_unrecorded("s1", "models")
        writer.record_completion(completion("s1"))
        writer.flush()
        assert unrecorded(root, "s1") == {"probe": 2, "models": 1}  # the live row, before any commit
    assert committed_unrecorded(root, "s1") == {"probe": 2, "models": 1}  # the close committed it
    crashed_writer_calls(root, "s1")  # the table's row counts 1 call, the log holds 2
    with StoreWriter(root) as writer:
        writer.note_unrecorded("s1", "client_error")
    assert unrecorded(root, "s1") == {"probe": 2, "models": 1, "client_error": 1}  # the recount kept them
    with StoreWriter(root) as writer:
        writer.note_unrecorded("s1", "client_error")
        writer.record_completion(completion("s1"))
    assert unrecorded(root, "s1") == committed_unrecorded(root, "s1") == {"probe": 2, "models": 1, "client_error": 2}
    assert connect(root).execute("SELECT completions FROM sessions").fetchone() == (3,)


def test_a_session_whose_row_was_lost_is_recounted_without_counts(root):
    crashed_writer_calls(root, "s1")  # the row never reached the store: its counts are gone with it
    with StoreWriter(root) as writer:
        assert unrecorded(root, "s1") is None and read_sessions(root, ["s1"])["completions"].to_pylist() == [1]
        writer.note_unrecorded("s1", "client_error")
    assert committed_unrecorded(root, "s1") == {"client_error": 1}


def test_a_session_with_counts_and_no_call_is_committed_on_close(root):
    with StoreWriter(root) as writer:
        writer.note_unrecorded("quiet", "models")
        writer.flush()
        assert unrecorded(root, "quiet") == {"models": 1}
    assert committed_unrecorded(root, "quiet") == {"models": 1}
    reader = StoreReader(root)
    assert reader.session("quiet")["completions"] == 0 and reader.session_ids() == []


def test_unknown_kinds_are_refused(writer):
    with pytest.raises(ValueError, match="unrecorded kind"):
        writer.note_unrecorded("s1", "other")


AT = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


def write_old_session(root, row, drop):
    """A version-2 session file without the columns `drop` (written before they existed)."""
    older = pa.schema([field for field in storage_schema(SESSIONS) if field.name not in drop])
    path = root / "sessions" / f"session_id={row['session_id']}" / "session.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(rows_to_table("sessions", [row]).select(older.names).cast(older), path)


def test_session_rows_written_before_the_column_stay_readable(root):
    """A version-2 store whose session files predate `unrecorded_json` (and `revision`) migrates, reads, and
    takes new counts."""
    call = {**completion("old"), "seq": 0, "completion_id": "c-0", "created_at": AT, "finished_at": AT}
    (root / "completions" / "session_id=old").mkdir(parents=True)
    pq.write_table(rows_to_table("completions", [call]), root / "completions" / "session_id=old" / "part-1.parquet")
    base = {"status": "open", "prompt_tokens": 0, "completion_tokens": 0}
    write_old_session(root, {**base, "session_id": "old", "completions": 1, "prompt_tokens": 3,
                             "completion_tokens": 2, "started_at": AT, "ended_at": AT},
                      drop={"unrecorded_json", "revision"})
    write_old_session(root, {**base, "session_id": "new", "completions": 0, "unrecorded_json": '{"probe": 1}'},
                      drop={"revision"})
    (root / "log").mkdir()  # as a version-2 writer left it: its segments deleted, once parts held their rows
    (root / "VERSION").write_text("2\n")
    migrate_store(root)
    con = connect(root)
    assert con.execute("SELECT session_id, completions, unrecorded_json FROM sessions ORDER BY 1").fetchall() == [
        ("new", 0, '{"probe": 1}'), ("old", 1, None)]
    assert scan(root, "sessions").sort("session_id").collect()["unrecorded_json"].to_list() == ['{"probe": 1}', None]
    with StoreWriter(root) as writer:
        writer.note_unrecorded("old", "models")
        assert writer.record_completion(completion("old"))["seq"] == 1
    assert unrecorded(root, "old") == committed_unrecorded(root, "old") == {"models": 1}
    assert read_sessions(root, ["old"])["completions"].to_pylist() == [2]
