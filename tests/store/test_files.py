import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tracetap.store import location
from tracetap.store.files import (
    StoreError,
    check_store,
    read_parquet,
    read_version,
    storage_schema,
    write_parquet_atomic,
    write_parquet_atomic_many,
)
from tracetap.store.schema import SCHEMA_VERSION, SESSIONS
from tracetap.store.tables import rows_to_table


def test_atomic_write_leaves_one_complete_file(tmp_path):
    path = tmp_path / "a" / "b" / "x.parquet"
    table = rows_to_table("sessions", [{"session_id": "s1", "completions": 3}])
    write_parquet_atomic(path, table)
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.parquet"]
    assert pq.read_table(path).equals(table)


def test_rewrite_replaces_the_file_whole(tmp_path):
    path = tmp_path / "x.parquet"
    for count in (1, 2):
        write_parquet_atomic(path, rows_to_table("sessions", [{"session_id": "s1", "completions": count}]))
    assert pq.read_table(path).column("completions").to_pylist() == [2]


def test_failed_write_leaves_neither_temp_nor_final_file(tmp_path):
    union = pa.UnionArray.from_dense(pa.array([0], pa.int8()), pa.array([0], pa.int32()), [pa.array([1])])
    unwritable = pa.table({"u": union})  # Parquet has no union type: the write fails midway
    with pytest.raises(pa.ArrowException):
        write_parquet_atomic(tmp_path / "x.parquet", unwritable)
    assert list(tmp_path.iterdir()) == []


def _sessions_table(count: int) -> pa.Table:
    return rows_to_table("sessions", [{"session_id": "s1", "completions": count}])


@pytest.mark.parametrize("syncfs", [True, False], ids=["syncfs", "fsync-each"])
def test_a_batch_of_files_lands_whole_in_new_and_old_directories(tmp_path, monkeypatch, syncfs):
    if not syncfs:  # a platform without syncfs(2): every file and directory is fsync'd on its own
        monkeypatch.setattr(location, "_syncfs", lambda: None)
    (tmp_path / "old").mkdir()
    paths = [tmp_path / "old" / "x.parquet", tmp_path / "new" / "deep" / "y.parquet", tmp_path / "old" / "z.parquet"]
    write_parquet_atomic_many([(path, _sessions_table(n)) for n, path in enumerate(paths)])
    assert [pq.read_table(path).column("completions").to_pylist() for path in paths] == [[0], [1], [2]]
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["x.parquet", "y.parquet", "z.parquet"]


def test_a_failed_file_in_a_batch_leaves_no_temp_and_replaces_nothing(tmp_path):
    write_parquet_atomic(tmp_path / "x.parquet", _sessions_table(1))
    union = pa.UnionArray.from_dense(pa.array([0], pa.int8()), pa.array([0], pa.int32()), [pa.array([1])])
    with pytest.raises(pa.ArrowException):
        write_parquet_atomic_many([(tmp_path / "x.parquet", _sessions_table(2)),
                                   (tmp_path / "y.parquet", pa.table({"u": union}))])
    assert [p.name for p in tmp_path.iterdir()] == ["x.parquet"]
    assert pq.read_table(tmp_path / "x.parquet").column("completions").to_pylist() == [1]


@pytest.mark.parametrize("damage", [lambda data: data[: len(data) // 2] + b"x" * 10 + data[-8:],
                                    lambda data: b"not parquet"], ids=["footer", "magic"])
def test_a_damaged_file_is_a_store_error_naming_it(tmp_path, damage):
    path = tmp_path / "x.parquet"
    write_parquet_atomic(path, _sessions_table(1))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(StoreError, match=f"{path} is not a readable Parquet file"):
        read_parquet([path], SESSIONS)
    with pytest.raises(FileNotFoundError):  # a vanished file stays what readers retry on
        read_parquet([tmp_path / "gone.parquet"], SESSIONS)


def test_read_parquet_casts_to_the_store_schema_and_handles_no_files(tmp_path):
    assert read_parquet([], SESSIONS).schema == storage_schema(SESSIONS)
    path = tmp_path / "s.parquet"
    write_parquet_atomic(path, rows_to_table("sessions", [{"session_id": "s1"}]))
    table = read_parquet([path, path], SESSIONS, ["session_id", "completions"])
    assert table.to_pylist() == [{"session_id": "s1", "completions": None}] * 2


def test_storage_schema_drops_docs_only():
    stored = storage_schema(SESSIONS)
    assert stored.names == SESSIONS.names and stored.types == SESSIONS.types
    assert all(field.metadata is None for field in stored)


@pytest.mark.parametrize("version_text, error", [(None, "no VERSION"), ("x\n", "not a schema version"),
                                                 (f"{SCHEMA_VERSION + 1}\n", "schema version")])
def test_check_store_explains_what_is_wrong(tmp_path, version_text, error):
    if version_text is not None:
        (tmp_path / "VERSION").write_text(version_text)
    with pytest.raises(StoreError, match=error):
        check_store(tmp_path)


def test_check_store_accepts_a_store_and_refuses_a_missing_dir(tmp_path):
    (tmp_path / "VERSION").write_text(f"{SCHEMA_VERSION}\n")
    assert check_store(tmp_path) == tmp_path
    assert read_version(tmp_path) == SCHEMA_VERSION
    with pytest.raises(StoreError, match="does not exist"):
        check_store(tmp_path / "missing")


def test_read_parquet_casts_a_file_written_with_other_types(tmp_path):
    """A file whose column types differ from the schema (an older layout) is cast, not misread."""
    path = tmp_path / "old.parquet"
    pq.write_table(pa.table({"session_id": ["s1"], "completions": pa.array([3], pa.int64())}), path)
    fast = tmp_path / "new.parquet"
    write_parquet_atomic(fast, rows_to_table("sessions", [{"session_id": "s2", "completions": 4}]))
    table = read_parquet([path, fast], SESSIONS, ["session_id", "completions"])
    assert table.schema == pa.schema([storage_schema(SESSIONS).field(n) for n in ("session_id", "completions")])
    assert table.to_pylist() == [{"session_id": "s1", "completions": 3}, {"session_id": "s2", "completions": 4}]


@pytest.mark.parametrize("layout", ["current", "older"])
def test_a_file_replaced_while_read_is_read_whole_old_or_new(tmp_path, layout):
    """The writer rewrites a session's row in place (temp + rename) while readers read it: each read
    sees one complete version, also when an older layout is read and cast."""
    path, stop = tmp_path / "x.parquet", threading.Event()

    def table(count: int) -> pa.Table:
        rows = _sessions_table(count)
        return rows.drop_columns(["unrecorded_json"]) if layout == "older" else rows

    def rewrite() -> None:
        count = 0
        while not stop.is_set():
            count += 1
            write_parquet_atomic(path, table(count))

    write_parquet_atomic(path, table(0))
    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        counts = [read_parquet([path], SESSIONS).column("completions")[0].as_py() for _ in range(300)]
    finally:
        stop.set()
        writer.join()
    assert counts == sorted(counts) and len(set(counts)) > 1
