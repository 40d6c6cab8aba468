"""Store locations: URLs parsed and checked before any key is built, and files on an fsspec filesystem
(fsspec's in-memory one here; tests/objstore drives S3) written with one PUT each, no temp objects. A
filesystem deltalake cannot commit to (such as `memory://`) cannot hold a store's tables: refused."""

from __future__ import annotations

import secrets
from pathlib import Path

import fsspec
import pytest
from store_rows import completion
from tracetap.store import (
    InvalidLocation,
    ObjectPath,
    StoreWriter,
    compact_sessions,
    save_task,
    store_path,
    write_session_table,
)
from tracetap.store.commit_log import encode_line
from tracetap.store.delta import table_uri
from tracetap.store.location import exists, is_dir, list_names, read_bytes, remove, write_atomic, write_new
from tracetap.store.log_reading import log_rows
from tracetap.store.paths import live_file, log_segments
from tracetap.store.reading import read_completions


@pytest.mark.parametrize("url, key", [("s3://bucket", "bucket"), ("s3://bucket/a/b/", "bucket/a/b"),
                                      ("gs://my-bucket.x/runs_1/store", "my-bucket.x/runs_1/store")])
def test_urls_become_object_paths(url, key):
    path = store_path(url)
    assert isinstance(path, ObjectPath) and path.key == key and str(path) == f"{path.protocol}://{key}"


@pytest.mark.parametrize("value, expected", [("runs/store", Path("runs/store")), ("file:///tmp/s", Path("/tmp/s")),
                                             (Path("x"), Path("x"))])
def test_local_paths_stay_paths(value, expected):
    assert store_path(value) == expected


@pytest.mark.parametrize("url", ["s3://key:secret@bucket/store", "s3://key@bucket", "s3://bucket/../x",
                                 "s3://bucket//x", "s3://bucket/a b", "s3://bucket/./x", "s3://", "s3://b/é"])
def test_bad_urls_are_refused(url):
    with pytest.raises(InvalidLocation) as error:
        store_path(url)
    assert "secret" not in str(error.value)


@pytest.mark.parametrize("part", ["..", ".", "a/b", "", "a b", "a\nb"])
def test_object_paths_join_only_plain_parts(part):
    with pytest.raises(InvalidLocation):
        store_path("s3://bucket/store") / part


def test_paths_on_an_object_store_follow_the_layout():
    root = store_path("s3://bucket/store")
    assert table_uri(root, "completions") == "s3://bucket/store/completions"
    assert table_uri("s3://bucket/store", "sessions") == "s3://bucket/store/sessions"
    assert str(live_file(root, "abc123")) == "s3://bucket/store/log/abc123.sessions.parquet"
    assert root.joinpath("log", "x-000001.jsonl").parent == root / "log"
    assert (root / "log" / "x-000001.jsonl").stem == "x-000001" and (root / "log").name == "log"
    with pytest.raises(ValueError):
        live_file(root, "../x")
    with pytest.raises(ValueError, match="unknown Delta table"):
        table_uri(root, "nope")


def memory_root() -> ObjectPath:
    root = store_path(f"memory://b{secrets.token_hex(4)}/store")
    assert isinstance(root, ObjectPath)
    return root


def test_files_on_an_fsspec_filesystem_are_written_with_one_put_and_no_temp_object():
    root = memory_root()
    target = root / "grants" / "x.json"
    write_atomic(target, lambda handle: handle.write(b'{"a": 1}'))
    assert fsspec.filesystem("memory").find(root.key) == [f"/{target.key}"]  # no temp name, no rename
    assert read_bytes(target) == b'{"a": 1}' and read_bytes(str(target), 1, 5) == b'"a":'
    assert not write_new(target, b"other") and read_bytes(target) == b'{"a": 1}'  # never replaced
    assert write_new(root / "grants" / "y.json", b"{}")
    assert sorted(list_names(root / "grants")) == ["x.json", "y.json"]
    assert is_dir(root / "grants") and exists(target) and not exists(root / "nope")
    remove(target)
    remove(target)  # already gone: no error
    assert list_names(root / "grants") == ["y.json"]


def test_log_objects_on_an_fsspec_filesystem_read_back():
    """An object store's log is one object per batch (store/commit_log.py); readers read its rows."""
    root = memory_root()
    lines = [encode_line({**completion(), "seq": seq, "completion_id": f"c-{seq}"}) for seq in range(3)]
    write_atomic(root / "log" / "0dead-000000.jsonl", lambda handle: handle.write(lines[0] + lines[1]))
    write_atomic(root / "log" / "0dead-000001.jsonl", lambda handle: handle.write(lines[2]))
    write_atomic(root / "log" / "0dead.sessions.parquet", lambda handle: handle.write(b"not a segment"))
    assert [path.name for path in log_segments(root)] == ["0dead-000000.jsonl", "0dead-000001.jsonl"]
    assert log_rows(root).column("completion_id").to_pylist() == ["c-0", "c-1", "c-2"]
    assert read_completions(root, ["s1"], ["seq"])["s1"]["seq"].to_pylist() == [0, 1, 2]


def test_a_filesystem_delta_cannot_commit_to_is_refused_with_a_clear_error():
    root = memory_root()
    refused = f"{root} cannot hold Delta tables: use a local path or one of s3://"
    with pytest.raises(ValueError, match=refused):
        write_session_table(root, "rewards", "s1", [{"reward": 1.0}], evaluator="e")
    with pytest.raises(ValueError, match=refused):
        save_task(str(root), "t1", "running", {}, {})
    line = encode_line({**completion(), "seq": 0, "completion_id": "c-0"})  # a call logged there: never committed
    write_atomic(root / "log" / "0dead-000000.jsonl", lambda handle: handle.write(line))
    with pytest.raises(ValueError, match=refused):
        compact_sessions(root)
    assert not [key for key in fsspec.filesystem("memory").find(root.key) if "_delta_log" in key]


def test_a_writer_refuses_a_filesystem_delta_cannot_commit_to_before_it_takes_a_call():
    """A gateway on such a store would acknowledge calls it can never commit: it refuses to open."""
    with pytest.raises(ValueError, match="cannot hold Delta tables"):
        StoreWriter(memory_root()).close()
