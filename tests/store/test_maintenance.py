"""history and vacuum (store/maintenance.py) on real Delta tables written through the store's writers."""

from __future__ import annotations

import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from store_rows import completion, snapshot
from tracetap.store import (
    DEFAULT_RETAIN_HOURS,
    StoreError,
    StoreWriter,
    compact_sessions,
    connect,
    history,
    vacuum,
    write_session_table,
)
from tracetap.store.compaction import COMPACTOR
from tracetap.store.delta import open_table, read
from tracetap.store.maintenance import VACUUM_WRITER

WRITER = "tracetap evaluate"


@pytest.fixture
def store(root: Path) -> Path:
    with StoreWriter(root):  # the store's directory and VERSION, as a gateway leaves them
        pass
    return root


def reward(root: Path, value: float, sid: str = "s1") -> None:
    write_session_table(root, "rewards", sid, [{"reward": value}], evaluator="e", writer=WRITER)


def rewards_at(root: Path, version: int | None = None) -> list[tuple[str, float]]:
    rows = read(open_table(root, "rewards", version), "rewards").to_pylist()
    return sorted((row["session_id"], row["reward"]) for row in rows)


def data_files(root: Path, table: str) -> set[str]:
    folder = root / table
    return {str(p.relative_to(folder)) for p in folder.rglob("*.parquet") if "_delta_log" not in p.parts}


def replaced(root: Path) -> tuple[Path, str]:
    """A store whose rewards hold s1's reward 0.5, then (version 2) 1.0; returns it and version 1's file."""
    reward(root, 0.5)
    first = data_files(root, "rewards")
    reward(root, 1.0)
    (old,) = first
    return root, old


def test_history_lists_each_version_newest_first_with_its_writer(store):
    start = datetime.now(UTC) - timedelta(seconds=1)
    reward(store, 0.5)
    write_session_table(store, "rewards", "s1", [{"reward": 1.0}, {"reward": 2.0, "evaluator": "e"}],
                        evaluator="e", writer=WRITER)
    write_session_table(store, "trajectories", "s1", [{"trace_index": 0}], builder="b", writer="tracetap build")
    versions = history(store)
    assert [(v.table, v.version, v.operation, v.writer) for v in versions] == [
        ("rewards", 2, "WRITE", WRITER), ("rewards", 1, "WRITE", WRITER), ("rewards", 0, "CREATE TABLE", WRITER),
        ("trajectories", 1, "WRITE", "tracetap build"), ("trajectories", 0, "CREATE TABLE", "tracetap build")]
    assert [(v.rows_added, v.files_added, v.files_removed) for v in versions[:2]] == [(2, 1, 1), (1, 1, 0)]
    assert versions[3].rows_added == 1 and versions[2].rows_added is None  # a creation adds nothing
    times = [v.timestamp for v in versions[:3]]
    assert times == sorted(times, reverse=True)
    assert all(start <= t <= datetime.now(UTC) and t.tzinfo == UTC for t in times)


def test_history_of_chosen_tables_at_most_limit_each(store):
    for value in (0.1, 0.2, 0.3):
        reward(store, value)
    write_session_table(store, "trajectories", "s1", [{"trace_index": 0}], builder="b")
    assert [(v.table, v.version) for v in history(store, ["rewards"], limit=2)] == [("rewards", 3), ("rewards", 2)]
    assert [(v.table, v.version) for v in history(store, ["trajectories", "rewards"], limit=1)] == [
        ("trajectories", 1), ("rewards", 3)]
    assert history(store, ["rollouts"]) == []  # not written yet
    with pytest.raises(ValueError, match="unknown Delta table.*nope"):
        history(store, ["rewards", "nope"])
    with pytest.raises(ValueError, match="limit"):
        history(store, limit=-1)


def test_a_store_without_delta_tables_has_no_history_and_nothing_to_vacuum(store):
    assert history(store) == []
    assert vacuum(store, retain_hours=0) == {}


def test_vacuum_without_retention_deletes_the_replaced_file_and_keeps_the_latest_rows(store):
    _, old = replaced(store)
    latest = rewards_at(store)
    assert vacuum(store, retain_hours=0) == {"rewards": [old]}
    assert not (store / "rewards" / old).exists()
    assert data_files(store, "rewards") and old not in data_files(store, "rewards")
    assert rewards_at(store) == latest == [("s1", 1.0)]
    assert [(v.operation, v.writer) for v in history(store, limit=2)] == [
        ("VACUUM END", VACUUM_WRITER), ("VACUUM START", VACUUM_WRITER)]


def test_a_dry_run_lists_what_it_would_delete_and_changes_nothing(store):
    _, old = replaced(store)
    before, versions = snapshot(store), history(store)
    assert vacuum(store, retain_hours=0, dry_run=True) == {"rewards": [old]}
    assert snapshot(store) == before and history(store) == versions


def test_an_old_version_reads_after_a_default_vacuum_but_not_after_one_without_retention(store):
    replaced(store)
    assert vacuum(store) == {"rewards": []}  # version 1's file was replaced moments ago: within the week
    assert rewards_at(store, 1) == [("s1", 0.5)]
    vacuum(store, retain_hours=0)
    with pytest.raises(FileNotFoundError):
        rewards_at(store, 1)
    assert rewards_at(store) == [("s1", 1.0)]


def test_a_second_vacuum_finds_nothing_and_commits_nothing(store):
    replaced(store)
    vacuum(store, retain_hours=0)
    versions = history(store)
    # deltalake itself would list (and "delete") the file again until the log forgets its removal
    assert vacuum(store, retain_hours=0, dry_run=True) == vacuum(store, retain_hours=0) == {"rewards": []}
    assert history(store) == versions


def test_vacuum_of_a_partitioned_table_and_of_a_folder_gone(store):
    write_session_table(store, "trajectories", "s1", [{"trace_index": 0}], builder="b")
    write_session_table(store, "trajectories", "s1", [{"trace_index": 0}], builder="gone")
    first = data_files(store, "trajectories")
    write_session_table(store, "trajectories", "s1", [], builder="gone")  # no rows: the builder's rows removed
    write_session_table(store, "trajectories", "s1", [{"trace_index": 1}], builder="b")
    assert {name.partition("/")[0] for name in first} == {"builder=b", "builder=gone"}
    assert vacuum(store, retain_hours=0) == {"trajectories": sorted(first)}
    assert not any((store / "trajectories" / name).exists() for name in first)
    shutil.rmtree(store / "trajectories" / "builder=gone")  # empty folders now; an object store has none
    assert vacuum(store, retain_hours=0) == {"trajectories": []}
    assert [row["trace_index"] for row in read(open_table(store, "trajectories"), "trajectories").to_pylist()] == [1]


def test_files_no_commit_added_go_only_when_older_than_a_full_scan_retention(store):
    reward(store, 0.5)
    folder, week_ago = store / "rewards", time.time() - (DEFAULT_RETAIN_HOURS + 1) * 3600
    for name in ("part-old-orphan.parquet", "part-new-orphan.parquet"):  # files of writes that died
        (folder / name).write_bytes(b"not committed")
    os.utime(folder / "part-old-orphan.parquet", (week_ago, week_ago))
    assert vacuum(store, retain_hours=0) == {"rewards": []}  # a short retention: removed files only
    assert vacuum(store) == {"rewards": ["part-old-orphan.parquet"]}
    assert not (folder / "part-old-orphan.parquet").exists() and (folder / "part-new-orphan.parquet").exists()
    assert rewards_at(store) == [("s1", 0.5)]


def test_a_negative_retention_is_refused(store):
    replaced(store)
    with pytest.raises(ValueError, match="retention"):
        vacuum(store, retain_hours=-1)


def test_a_damaged_log_is_a_store_error_naming_the_table(store):
    replaced(store)
    (store / "rewards" / "_delta_log" / "00000000000000000003.json").write_text("not json{")
    with pytest.raises(StoreError, match="^Delta table rewards: "):
        history(store)
    with pytest.raises(StoreError, match="^Delta table rewards: "):
        vacuum(store, dry_run=True)


def test_history_names_the_gateway_and_the_compact_command_behind_each_commit_of_calls(store):
    with StoreWriter(store) as writer:
        writer.record_completion(completion("s1"))
        writer.close_session("s1")
        writer.record_completion(completion("s1"))
        assert compact_sessions(store) == {"s1": 1}
    versions = history(store, ["completions", "sessions"])
    gateway = {v.writer for v in versions} - {COMPACTOR}
    assert len(gateway) == 1 and gateway.pop().startswith("tracetap gateway ")
    calls = [(v.writer == COMPACTOR, v.rows_added) for v in versions
             if v.table == "completions" and v.operation == "WRITE"]
    assert calls == [(True, 1), (False, 1)]  # its close found nothing left to commit


def test_vacuum_after_many_compactions_keeps_every_call_and_session(store):
    with StoreWriter(store) as writer:
        for _ in range(6):
            for sid in ("s1", "s2"):
                writer.record_completion(completion(sid))
            writer.compact_idle(0.0)  # each commits both sessions' rows again: the sessions file is replaced
    con = connect(store)
    sql = {"completions": "SELECT session_id, count(*) FROM completions GROUP BY ALL ORDER BY 1",
           "sessions": "SELECT session_id, completions FROM sessions ORDER BY 1"}
    before = {table: con.execute(query).fetchall() for table, query in sql.items()}
    assert before == {table: [("s1", 6), ("s2", 6)] for table in sql}
    deleted = vacuum(store, retain_hours=0)
    assert deleted["completions"] == [] and len(deleted["sessions"]) >= 5  # calls are only ever added
    assert {table: con.execute(query).fetchall() for table, query in sql.items()} == before
    assert {table: connect(store).execute(query).fetchall() for table, query in sql.items()} == before
