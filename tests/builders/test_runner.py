"""build(): reading sessions from the store, writing the trajectories partition, the summary."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
from deltalake import DeltaTable
from toychat import Conversation, failure
from tracestore import read_traces, write_store
from tracetap.builders import build, default_workers, list_sessions, load_session
from tracetap.builders.runner import PROCESS_MIN_SESSIONS, READ_BATCH, _executor
from tracetap.store import InvalidSessionId, StoreError, StoreReader, StoreWriter

from tracetap.common import decode as decode_text


def agent_rows(session_id: str, turns: int) -> list[dict]:
    chat = Conversation([10], session_id=session_id).say("user", [20])
    rows = []
    for turn in range(turns):
        rows.append(chat.ask([30 + turn], "tool_calls"))
        chat.say("tool", [40 + turn])
    return rows


@pytest.fixture
def store_root(tmp_path):
    rows = agent_rows("a", 3) + agent_rows("b", 2) + [failure(502, session_id="b")]
    return write_store(tmp_path / "store", rows)


def test_build_commits_its_traces_to_the_builders_partition(store_root):
    seen = []
    summary = build(store_root, "prefix_merging", progress=seen.append)
    assert seen == ["a", "b"] == list_sessions(store_root)
    stored = DeltaTable(str(store_root / "trajectories")).to_pyarrow_table()  # as any Delta reader sees it
    assert sorted(stored.column("session_id").to_pylist()) == ["a", "b"]
    assert set(stored.column("builder").to_pylist()) == {"prefix_merging"}
    assert (store_root / "trajectories" / "builder=prefix_merging").is_dir()
    assert (summary.sessions, summary.traces, summary.chains, summary.segments) == (2, 2, 2, 2)
    assert summary.not_trainable == ["b"]  # its last call failed upstream
    assert summary.session_stats["a"]["completions_merged"] == 2
    assert summary.to_dict()["break_reasons"] == {}


def test_rebuild_replaces_a_session_and_leaves_no_temp_files(store_root):
    build(store_root, "per_request")
    with StoreWriter(store_root) as writer:  # the session goes on after the first build
        writer.record_completion(agent_rows("a", 4)[-1])
    summary = build(store_root, "per_request", session_ids=["a"])
    assert summary.sessions == 1 and len(read_traces(store_root, "per_request", "a")) == 4
    assert len(read_traces(store_root, "per_request", "b")) == 2
    assert not list(store_root.rglob("*.tmp"))


def test_session_with_only_failed_calls_has_no_traces(tmp_path):
    root = write_store(tmp_path / "store", [failure(502, session_id="c"), failure(504, "timeout", "c")])
    summary = build(root, "prefix_merging", session_ids=["c", "c"])
    assert (summary.sessions, summary.traces, summary.not_trainable) == (1, 0, ["c"])
    assert StoreReader(root).trajectories("prefix_merging").num_rows == 0


def test_compacted_and_loose_files_read_alike(store_root):
    before, _ = load_session(store_root, "a")
    with StoreWriter(store_root) as writer:
        writer.close_session("a")
    after, session = load_session(store_root, "a")
    assert [r["completion_id"] for r in after] == [r["completion_id"] for r in before]
    for old, new in zip(before, after, strict=True):  # prompts as builders read them: compact
        assert new["prompt_suffix_ids"].tolist() == old["prompt_suffix_ids"].tolist()
        assert (new["prompt_ref_seq"], new["prompt_ref_len"]) == (old["prompt_ref_seq"], old["prompt_ref_len"])
    assert session["status"] == "closed"
    summary = build(store_root, "prefix_merging", session_ids=["a"])
    assert summary.session_stats["a"]["completions_merged"] == 2


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"builder": "nope"}, ValueError, "unknown builder 'nope'"),
    ({"session_ids": ["missing"]}, ValueError, "no completions recorded for session(s): missing"),
    ({"session_ids": ["../etc"]}, InvalidSessionId, "invalid session id"),
    ({"eot_id": -1}, ValueError, "non-negative integer"),
    ({"workers": 0}, ValueError, "workers must be a positive integer, got 0"),
])
def test_bad_arguments_are_clear_errors_and_write_nothing(store_root, kwargs, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(store_root, **{"builder": "prefix_merging", **kwargs})
    assert not (store_root / "trajectories").exists() or not any((store_root / "trajectories").iterdir())


def test_a_directory_that_is_not_a_store_is_an_error(tmp_path):
    with pytest.raises(StoreError, match="not a tracetap store"):
        build(tmp_path, "per_request")


def _traces_of(root, builder: str, sessions: list[str]) -> dict[str, list[dict]]:
    return {sid: read_traces(root, builder, sid) for sid in sessions}


@pytest.mark.parametrize("builder", ["prefix_merging", "per_request"])
def test_worker_processes_build_what_one_process_builds(tmp_path, builder):
    sids = [f"s{n:02d}" for n in range(2 * READ_BATCH + 3)]  # three batches, the last one short
    rows = [row for n, sid in enumerate(sids) for row in agent_rows(sid, 1 + n % 4)] + [failure(502, session_id="s05")]
    root = write_store(tmp_path / "store", rows)
    alone = build(root, builder)
    in_process = _traces_of(root, builder, sids)
    seen = []
    parallel = build(root, builder, progress=seen.append, workers=2)
    assert seen == sids  # in session order, each once written
    assert parallel.to_dict() == alone.to_dict() and parallel.not_trainable == ["s05"]
    assert _traces_of(root, builder, sids) == in_process


def test_a_decode_that_cannot_go_to_a_process_builds_in_process(store_root):
    closure = lambda ids: " ".join(map(str, ids))  # noqa: E731
    for workers, decode, kind in [(2, None, ProcessPoolExecutor), (2, decode_text, ProcessPoolExecutor),
                                  (2, closure, ThreadPoolExecutor), (1, None, ThreadPoolExecutor)]:
        pool = _executor(workers, decode)
        pool.shutdown()
        assert type(pool) is kind
    summary = build(store_root, "prefix_merging", decode=closure, workers=2)
    assert summary.sessions == 2 and len(read_traces(store_root, "prefix_merging", "a")) == 1


def test_large_builds_get_a_worker_per_core_and_small_ones_none():
    assert default_workers(PROCESS_MIN_SESSIONS - 1) == 1
    assert default_workers(PROCESS_MIN_SESSIONS) == min(len(os.sched_getaffinity(0)), 8)
