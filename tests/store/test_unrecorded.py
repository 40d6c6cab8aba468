"""The writer's count of calls answered without a completion row, and stores written before it."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_rows import completion
from tracetap.store import StoreWriter, connect, scan
from tracetap.store.files import storage_schema
from tracetap.store.paths import session_file
from tracetap.store.schema import SESSIONS


def unrecorded(root, sid):
    text = pq.read_table(session_file(root, sid)).column("unrecorded_json")[0].as_py()
    return json.loads(text) if text else None


def test_counts_are_saved_kept_across_recounts_and_reopen(root):
    with StoreWriter(root) as writer:
        writer.note_unrecorded("s1", "probe")
        writer.note_unrecorded("s1", "probe")
        writer.note_unrecorded("s1", "models")
        writer.record_completion(completion("s1"))
    assert unrecorded(root, "s1") == {"probe": 2, "models": 1}
    session_file(root, "s1").unlink()  # a crash before the first row save: recounted on open
    with StoreWriter(root) as writer:
        writer.note_unrecorded("s1", "client_error")
    assert unrecorded(root, "s1") == {"client_error": 1}
    with StoreWriter(root) as writer:
        writer.note_unrecorded("s1", "client_error")
        writer.record_completion(completion("s1"))
    assert unrecorded(root, "s1") == {"client_error": 2}
    assert connect(root).execute("SELECT completions FROM sessions").fetchone() == (2,)


def test_unknown_kinds_are_refused(writer):
    with pytest.raises(ValueError, match="unrecorded kind"):
        writer.note_unrecorded("s1", "other")


def test_session_rows_written_before_the_column_stay_readable(root):
    with StoreWriter(root) as writer:
        writer.record_completion(completion("old"))
        writer.note_unrecorded("new", "probe")
    older = pa.schema([field for field in storage_schema(SESSIONS) if field.name != "unrecorded_json"])
    row = pq.read_table(session_file(root, "old")).select(older.names)
    pq.write_table(row.cast(older), session_file(root, "old"))
    con = connect(root)
    assert con.execute("SELECT session_id, completions, unrecorded_json FROM sessions ORDER BY 1").fetchall() == [
        ("new", 0, '{"probe": 1}'), ("old", 1, None)]
    assert scan(root, "sessions").sort("session_id").collect()["unrecorded_json"].to_list() == ['{"probe": 1}', None]
    with StoreWriter(root) as writer:
        writer.note_unrecorded("old", "models")
    assert unrecorded(root, "old") == {"models": 1}
