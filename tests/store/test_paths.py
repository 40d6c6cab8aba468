"""Where the store's own files live (store/paths.py): the log's segments and live files, grants, and the ids
that become path parts."""

import pytest
from tracetap.store.delta import DELTA_TABLES, table_uri
from tracetap.store.paths import (
    InvalidSessionId,
    grant_file,
    live_file,
    live_files,
    log_segments,
    segment_name,
    validate_filename,
    validate_name,
    validate_session_id,
)


@pytest.mark.parametrize("sid", ["a", "A1", "run-1.2_x", "a" * 128, "x..", "9", "key-0123456789abcdef"])
def test_valid_session_ids_pass_unchanged(sid):
    assert validate_session_id(sid) == sid


@pytest.mark.parametrize("sid", ["", "../x", "a/b", ".hidden", "..", "-a", "_a", "a" * 129, "a\n", "a b",
                                 "é", "a\\b", None, 5, b"abc"])
def test_invalid_session_ids_raise(sid):
    with pytest.raises(InvalidSessionId):
        validate_session_id(sid)


def test_invalid_session_id_is_a_value_error():
    assert issubclass(InvalidSessionId, ValueError)


def test_every_table_lives_in_its_directory_under_the_root(tmp_path):
    assert {table: table_uri(tmp_path, table) for table in DELTA_TABLES} == {
        table: str(tmp_path / table) for table in ("completions", "sessions", "rewards", "trajectories", "rollouts")}
    with pytest.raises(ValueError, match="unknown Delta table"):
        table_uri(tmp_path, "../completions")


def test_log_names_follow_the_layout(tmp_path):
    assert segment_name("ab12", 7) == "ab12-000007.jsonl"
    assert segment_name("ab12", 1234567) == "ab12-1234567.jsonl"
    assert live_file(tmp_path, "ab12") == tmp_path / "log" / "ab12.sessions.parquet"


@pytest.mark.parametrize("writer_id", ["", "a-b", "a_b", "a.b", "../x", "a/b", "é"])
def test_writer_ids_are_letters_and_digits(tmp_path, writer_id):
    with pytest.raises(ValueError):
        segment_name(writer_id, 0)
    with pytest.raises(ValueError):
        live_file(tmp_path, writer_id)


def test_the_log_lists_segments_and_live_files_apart_skipping_other_names(tmp_path):
    assert log_segments(tmp_path) == [] and live_files(tmp_path) == []  # no log/ yet
    log = tmp_path / "log"
    log.mkdir()
    names = ["b2-000001.jsonl", "a1-000010.jsonl", "a1-000002.jsonl", "a1.sessions.parquet", "b2.sessions.parquet",
             ".a1-000003.jsonl.1f2e.tmp", ".a1.sessions.parquet.1f2e.tmp", "a1-1.jsonl", "notes.txt",
             "a-b-000001.jsonl"]
    for name in names:
        (log / name).write_bytes(b"")
    assert [path.name for path in log_segments(tmp_path)] == ["a1-000002.jsonl", "a1-000010.jsonl", "b2-000001.jsonl"]
    assert [path.name for path in live_files(tmp_path)] == ["a1.sessions.parquet", "b2.sessions.parquet"]
    assert [path.name for path in log_segments(str(tmp_path))] == [path.name for path in log_segments(tmp_path)]


def test_grant_files_stay_under_the_root(tmp_path):
    assert grant_file(tmp_path, "keys", "k1.json") == tmp_path / "grants" / "keys" / "k1.json"
    with pytest.raises(InvalidSessionId, match="escapes the store root"):
        grant_file(tmp_path, "keys", "../../../x")


@pytest.mark.parametrize("name", ["cmpl-ab", "per_request", "e.1"])
def test_names_that_become_path_parts_pass_unchanged(name):
    assert validate_name(name, "builder") == name


@pytest.mark.parametrize("name", ["../evil", "a/b", "", ".x", None])
def test_names_that_could_climb_out_are_refused_naming_what_they_are(name):
    with pytest.raises(ValueError, match="invalid completion id"):
        validate_name(name, "completion id")


@pytest.mark.parametrize("name", ["../x.parquet", ".hidden.parquet", "x.txt", "a/b.parquet", "", None])
def test_bad_file_names_are_rejected(name):
    with pytest.raises(ValueError):
        validate_filename(name)

