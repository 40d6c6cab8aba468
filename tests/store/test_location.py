"""Store locations: URLs parsed and checked before any key is built, and the store on an fsspec
filesystem (fsspec's in-memory one here; tests/objstore drives S3) written with PUTs, no temp objects."""

from __future__ import annotations

import secrets
from pathlib import Path

import fsspec
import pytest
from tracetap.store import InvalidLocation, ObjectPath, StoreReader, StoreWriter, compact_store, connect, store_path
from tracetap.store.paths import session_dir


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


def test_session_dirs_on_an_object_store_follow_the_layout():
    root = store_path("s3://bucket/store")
    assert str(session_dir(root, "trajectories", "s1", "per_request")) == (
        "s3://bucket/store/trajectories/builder=per_request/session_id=s1")
    with pytest.raises(ValueError):
        session_dir(root, "completions", "../x")


def test_a_store_on_an_fsspec_filesystem_records_compacts_and_reads():
    bucket = f"b{secrets.token_hex(4)}"
    url = f"memory://{bucket}/store"
    expected = [(0, [1, 2]), (1, [1, 2, 3]), (2, [1, 2, 3, 3])]
    with StoreWriter(url) as writer:
        for turn in range(3):
            writer.record_completion({"session_id": "s1", "status": "ok", "prompt_token_ids": [1, 2] + [3] * turn,
                                      "completion_token_ids": [3]})
        keys = fsspec.filesystem("memory").find(bucket)
        assert sum("/log/" in key for key in keys) == 3  # one object per batch, each call its own batch here
        assert not [key for key in keys if ".tmp" in key or key.rpartition("/")[2].startswith(".")]
        with connect(url) as con:  # the rows are only in the log objects
            assert con.execute("SELECT seq, prompt_token_ids FROM completions ORDER BY seq").fetchall() == expected
        assert compact_store(url) == {"s1": 3}
    # the close drops the log objects parts cover
    assert not [key for key in fsspec.filesystem("memory").find(bucket) if "/log/" in key]
    reader = StoreReader(url)
    assert [(r["seq"], r["prompt_token_ids"]) for r in reader.completions("s1").to_pylist()] == expected
    assert reader.session("s1")["completions"] == 3
