from pathlib import Path

import pytest
from tracetap.store.paths import (
    InvalidSessionId,
    completion_name,
    loose_seq,
    part_covered,
    part_name,
    session_dir,
    validate_filename,
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


def test_session_dirs_follow_the_layout(tmp_path):
    assert session_dir(tmp_path, "completions", "s1") == tmp_path / "completions" / "session_id=s1"
    assert session_dir(tmp_path, "sessions", "s1") == tmp_path / "sessions" / "session_id=s1"


BAD_PARTS = [("completions", "../x", None), ("sessions", "a/b", None), ("rewards", "s1", None), ("nope", "s1", None)]


@pytest.mark.parametrize("table, sid, builder", BAD_PARTS)
def test_session_dir_rejects_bad_parts(tmp_path, table, sid, builder):
    with pytest.raises(ValueError):
        session_dir(tmp_path, table, sid, builder)
    assert list(tmp_path.iterdir()) == []


def test_names_round_trip():
    assert completion_name(7, "cmpl-ab") == "00000007-cmpl-ab.parquet"
    assert loose_seq(Path(completion_name(7, "cmpl-ab"))) == 7
    assert part_covered(Path(part_name(12))) == 12
    assert loose_seq(Path(part_name(12))) is None
    assert part_covered(Path("00000001-x.parquet")) is None
    with pytest.raises(ValueError):
        completion_name(1, "../evil")


@pytest.mark.parametrize("name", ["../x.parquet", ".hidden.parquet", "x.txt", "a/b.parquet", "", None])
def test_bad_file_names_are_rejected(name):
    with pytest.raises(ValueError):
        validate_filename(name)

