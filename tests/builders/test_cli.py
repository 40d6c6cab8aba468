"""`tracetap build` through click's runner, on a store written by the real writer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from toychat import Conversation
from tracestore import read_traces, write_store
from tracetap.store import compact_sessions

from tracetap.cli import cli


def run(*args: str, code: int = 0):
    result = CliRunner().invoke(cli, ["build", *args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


@pytest.fixture
def store(tmp_path):
    """Sessions a and b: two turns cut at `length` (no end-of-turn to detect); b mixes weights."""
    rows = []
    for sid in ("a", "b"):
        chat = Conversation([10], session_id=sid).say("user", [20])
        rows.append(chat.ask([30], "length", policy_version="v1"))
        chat.say("user", [21])
        rows.append(chat.ask([31], "length", policy_version="v2" if sid == "b" else "v1"))
    return write_store(tmp_path / "store", rows)


def test_summary_names_breaks_by_reason_and_untrainable_sessions(store):
    output = run("--store", str(store), "--builder", "prefix_merging").output
    assert "sessions        2" in output and "traces          4" in output
    assert "chains          2" in output and "segments        4" in output
    assert "breaks          2 (eot_unavailable 2)" in output
    assert "not trainable   1 (b)" in output


def test_eot_id_and_session_options_reach_the_builder(store):
    args = ["--store", str(store), "--builder", "prefix_merging", "--session", "a", "--eot-id", "2", "--json"]
    summary = json.loads(run(*args).stdout)
    assert (summary["sessions"], summary["traces"], summary["break_reasons"]) == (1, 1, {})
    assert summary["session_stats"]["a"]["eot_source"] == "configured"
    assert len(read_traces(store, "prefix_merging", "a")) == 1
    assert read_traces(store, "prefix_merging", "b") == []


def test_json_summary_of_per_request(store):
    summary = json.loads(run("--store", str(store), "--builder", "per_request", "--workers", "2", "--json").stdout)
    assert (summary["traces"], summary["not_trainable"]) == (4, ["b"])
    assert summary["session_stats"]["b"]["not_trainable_reasons"] == ["mixed_policy_versions"]


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--builder", "prefix_merging", "--session", "zzz"], 1, "no completions recorded for session(s): zzz"),
    (["--builder", "prefix_merging", "--session", "../x"], 1, "invalid session id"),
    (["--builder", "nope"], 2, "'nope' is not one of"),
    (["--builder", "per_request", "--eot-id", "-3"], 2, "-3 is not in the range x>=0"),
    (["--builder", "per_request", "--workers", "0"], 2, "0 is not in the range x>=1"),
])
def test_bad_input_exits_non_zero_with_a_clear_message(store, args, code, message):
    assert message in run("--store", str(store), *args, code=code).output


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_damaged_session_file_is_a_clear_error(store, workers):
    compact_sessions(store)  # the session's rows in the completions table's files, none only in a log
    part = next((store / "completions" / "session_id=b").glob("*.parquet"))
    part.write_bytes(b"not parquet")
    result = run("--store", str(store), "--builder", "per_request", "--workers", workers, code=1)
    assert f"{part} is not a readable Parquet file" in result.output and "Traceback" not in result.output


def test_a_missing_store_is_an_error(tmp_path):
    result = run("--store", str(tmp_path / "nowhere"), "--builder", "per_request", code=1)
    assert "does not exist" in result.output


@pytest.fixture
def drifting(tmp_path):
    """12 sessions whose second prompt re-renders the first turn in other ids: building decodes them."""
    rows = []
    for n in range(12):
        chat = Conversation([10], session_id=f"s{n}").say("user", [20])
        rows.append(chat.ask([30, 31], canonical=[90]))
        rows.append(chat.say("user", [21]).ask([32]))
    return write_store(tmp_path / "store", rows)


def test_two_build_threads_decoding_first_at_once_load_the_tokenizer_once(drifting):
    """Each run is a fresh process, so both build threads ask for the cold tokenizer at the same moment."""
    command = [sys.executable, "-m", "tracetap.cli", "build", "--store", str(drifting), "--builder",
               "prefix_merging", "--workers", "1", "--json"]
    for _ in range(3):
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        summary = json.loads(done.stdout)
        assert (summary["sessions"], summary["drift_tokens_by_kind"]) == (12, {"content": 24})
