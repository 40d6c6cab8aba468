"""Older stores brought to the current schema version by `tracetap migrate`, and refused until then.

A schema-version-1 store (tests/fixtures/store-v1) has its completions as full rows; a version-2 store
(made here) keeps rewards, trajectories and rollouts as trees of files. Migrations are interrupted
(stopped, killed, or left in each crash state of a table's switch) and finished by running them again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from deltalake import write_deltalake
from sample_store import make_store
from store_forms import V1_SCHEMA, as_form
from store_rows import completion, snapshot
from tracetap.builders.exports import export
from tracetap.builders.runner import build
from tracetap.store import (
    SCHEMA_VERSION,
    StoreError,
    StoreReader,
    StoreWriter,
    check_store,
    compact_store,
    connect,
    migrate_store,
    read_tasks,
    save_task,
    scan,
    write_session_table,
)
from tracetap.store.delta import WRITER_KEY, open_table, read, table_uri
from tracetap.store.paths import session_dir
from tracetap.store.reading import read_session
from tracetap.store.schema import COMPLETIONS
from tracetap.store.tables import rows_to_table

from tracetap.cli import cli

FIXTURE = Path(__file__).parents[1] / "fixtures" / "store-v1"
SESSIONS = ["linear", "loose", "mixed"]
ROWS = 13
CURRENT = f"{SCHEMA_VERSION}\n"
AT = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)

# the version-2 store's trees: (path under the store, rows of one file)
REWARDS = {
    "rewards/session_id=s1/judge.parquet": [{"session_id": "s1", "evaluator": "judge", "reward": 1.0,
                                             "trace_rewards": [1.0, 0.5], "details_json": "{}", "created_at": AT}],
    "rewards/session_id=s1/tests.parquet": [{"session_id": "s1", "evaluator": "tests", "reward": 0.25,
                                             "details_json": '{"passed": 1}', "created_at": AT}],
    "rewards/session_id=s2/judge.parquet": [{"session_id": "s2", "evaluator": "judge", "reward": None,
                                             "details_json": '{"error": "boom"}', "created_at": AT}],
}


def trace(sid: str, builder: str, index: int) -> dict:
    return {"session_id": sid, "task_id": "t1", "builder": builder, "trace_index": index, "chain_index": 0,
            "segment_index": index, "completion_ids": [f"{sid}-{index}"], "prompt_token_ids": [1, 2, 3],
            "response_token_ids": [4, 5], "loss_mask": [1, 1], "response_logprobs": [-0.5, -0.25],
            "status": "ok", "metadata_json": json.dumps({"index": index})}


TRAJECTORIES = {
    "trajectories/builder=per_request/session_id=s1/part-0.parquet": [trace("s1", "per_request", 0),
                                                                       trace("s1", "per_request", 1)],
    "trajectories/builder=prefix_merging/session_id=s1/part-0.parquet": [trace("s1", "prefix_merging", 0)],
    "trajectories/builder=prefix_merging/session_id=s2/part-0.parquet": [trace("s2", "prefix_merging", 0)],
}
TASKS = {
    "t1": {"request": {"task_id": "t1", "prompt": "fix it", "n": 2},
           "result": {"task_id": "t1", "status": "completed", "sessions": [{"session_id": "s1", "reward": 1.0}]}},
    "t2": {"request": {"task_id": "t2", "prompt": "and this", "n": 1},
           "result": {"task_id": "t2", "status": "running", "sessions": []}},
}
COUNTS = {"rewards": 3, "trajectories": 4, "rollouts": 2}
FILES = {"rewards": 3, "trajectories": 3, "rollouts": 2}
KEYS = {"rewards": ["session_id", "evaluator"], "trajectories": ["builder", "session_id", "trace_index"],
        "rollouts": ["task_id"]}


@pytest.fixture
def v1(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURE, tmp_path / "store"))


@pytest.fixture
def reference(tmp_path: Path) -> Path:
    """The v1 fixture's rows read as is: a copy that claims the current version (readers still expand
    full rows), what every migration of the fixture must read the same as."""
    root = Path(shutil.copytree(FIXTURE, tmp_path / "reference"))
    (root / "VERSION").write_text(CURRENT)
    return root


@pytest.fixture
def v2(tmp_path: Path) -> Path:
    """A version-2 store: compact completions of two sessions, the three tables in their file layouts."""
    root = tmp_path / "v2"
    with StoreWriter(root) as writer:
        for sid in ("s1", "s2"):
            writer.record_completion(completion(sid))
    compact_store(root)  # each session as one part (whatever the writer left in its log)
    for path, rows in {**REWARDS, **TRAJECTORIES}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows_to_table(path.split("/")[0], rows), root / path)
    for task_id, body in TASKS.items():
        (root / f"rollouts/task_id={task_id}").mkdir(parents=True)
        (root / f"rollouts/task_id={task_id}/task.json").write_text(json.dumps(body, indent=1))
        os.utime(root / f"rollouts/task_id={task_id}/task.json", (AT.timestamp(), AT.timestamp()))
    (root / "VERSION").write_text("2\n")
    return root


def everything(root: Path, out: Path, sessions: list[str] = SESSIONS) -> dict:
    """What readers give: builds and exports, the completions view, the Python reader, the Polars scan."""
    exports = {}
    for builder in ("per_request", "prefix_merging"):
        build(root, builder)
        export(root, builder, "jsonl", out / f"{builder}.jsonl", force=True)
        exports[builder] = (out / f"{builder}.jsonl").read_bytes()
    columns = ", ".join(f'"{name}"' for name in COMPLETIONS.names)
    view = connect(root).execute(f"SELECT {columns}, chain_index, side_call FROM completions "
                                 "ORDER BY session_id, seq").fetchall()
    python = {sid: read_session(session_dir(root, "completions", sid)).to_pylist() for sid in sessions}
    frame = scan(root, "completions").sort(["session_id", "seq"]).collect().rows()
    return {"view": view, "python": python, "scan": frame, "exports": exports}


def calls_and_sessions(root: Path) -> dict[str, bytes]:
    """The files of the tables version 3 keeps as they were (completions, the log, sessions)."""
    return {path: data for path, data in snapshot(root).items() if path.split("/")[0] in ("log", "completions",
                                                                                           "sessions")}


def table_rows(root: Path, table: str) -> list[dict]:
    """A Delta table's rows as the store reads them, in key order."""
    return read(open_table(root, table), table).sort_by([(key, "ascending") for key in KEYS[table]]).to_pylist()


def expected_rows(table: str) -> list[dict]:
    """What the version-2 fixture's tree of `table` holds, as rows of the Delta table."""
    if table == "rollouts":
        rows = [{"task_id": task_id, "status": body["result"]["status"], "updated_at": AT,
                 "request_json": json.dumps(body["request"]), "result_json": json.dumps(body["result"])}
                for task_id, body in TASKS.items()]
    else:
        rows = [row for rows in {"rewards": REWARDS, "trajectories": TRAJECTORIES}[table].values() for row in rows]
    return rows_to_table(table, rows).sort_by([(key, "ascending") for key in KEYS[table]]).to_pylist()


def assert_migrated(root: Path) -> None:
    """Every table holds the fixture's rows once, the old trees and staging names are gone, VERSION is current."""
    for table in COUNTS:
        assert table_rows(root, table) == expected_rows(table), table
    assert sorted(name for name in os.listdir(root) if name.startswith(".") and name != ".writer.lock") == []
    assert not list(root.glob("rewards/session_id=*")) and not list(root.glob("rollouts/task_id=*"))
    assert (root / "VERSION").read_text() == CURRENT


def test_a_v1_store_is_refused_until_migrated_then_reads_as_its_rows_did(v1, reference, tmp_path):
    before = everything(reference, tmp_path)
    assert len(before["view"]) == ROWS and before["view"][4][1] == 4 and before["view"][4][-2] == 0
    assert before["python"]["linear"][4]["prompt_token_ids"][:3] == [1000, 1001, 1002]
    with pytest.raises(StoreError, match="schema version 1: run `tracetap migrate --store"):
        StoreReader(v1)
    report = migrate_store(v1)
    assert (report.from_version, report.sessions, report.rows, report.files, report.tables) == (1, 3, ROWS, 7, {})
    assert (v1 / "VERSION").read_text() == CURRENT
    assert sorted(p.name for p in v1.glob("completions/*/*.parquet")) == ["part-3.parquet", "part-5.parquet",
                                                                         "part-5.parquet"]
    assert everything(v1, tmp_path) == before
    again = migrate_store(v1)
    assert (again.sessions, again.current, again.tables) == (0, 3, {})


def test_a_dry_run_of_a_v1_store_counts_and_changes_nothing(v1):
    files = snapshot(v1)
    report = migrate_store(v1, dry_run=True)
    assert (report.sessions, report.rows, report.files, report.migrated) == (3, ROWS, 7, SESSIONS)
    assert snapshot(v1) == files


def test_a_writer_refuses_a_v1_store_until_it_is_migrated(v1):
    with pytest.raises(StoreError, match="tracetap migrate"):
        StoreWriter(v1)
    migrate_store(v1)
    with StoreWriter(v1) as writer:
        row = writer.record_completion({"session_id": "loose", "status": "ok", "prompt_token_ids": [1] * 200})
        assert row["seq"] == 3
        with pytest.raises(StoreError, match="open in a StoreWriter"):
            migrate_store(v1)


def test_a_migration_stopped_between_sessions_finishes_when_run_again(v1, reference, tmp_path):
    before = everything(reference, tmp_path)

    def stop(what: str, rows: int) -> None:
        raise KeyboardInterrupt(what)

    with pytest.raises(KeyboardInterrupt):
        migrate_store(v1, progress=stop)
    assert (v1 / "VERSION").read_text() == "1\n"
    with pytest.raises(StoreError, match="tracetap migrate"):
        StoreReader(v1)
    report = migrate_store(v1)
    assert (report.sessions, report.current) == (2, 1)
    assert everything(v1, tmp_path) == before


def test_a_killed_migration_finishes_when_run_again(v1, reference, tmp_path):
    before = everything(reference, tmp_path)
    with subprocess.Popen([sys.executable, "-m", "tracetap.cli", "migrate", "--store", str(v1)],
                          stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout.readline().startswith("session ")  # one session rewritten
        os.kill(process.pid, signal.SIGKILL)
    migrate_store(v1)
    assert (v1 / "VERSION").read_text() == CURRENT and everything(v1, tmp_path) == before


def test_the_command_prints_counts_and_refuses_a_store_with_a_writer(v1):
    dry = CliRunner().invoke(cli, ["migrate", "--store", str(v1), "--dry-run", "--json"])
    assert dry.exit_code == 0 and json.loads(dry.output)["rows"] == ROWS and (v1 / "VERSION").read_text() == "1\n"
    done = CliRunner().invoke(cli, ["migrate", "--store", str(v1)])
    assert done.exit_code == 0 and "session linear: rewrote 5 row(s)" in done.output
    assert "migrated 3 session(s), 13 row(s) in 7 file(s) from schema version 1" in done.output
    with StoreWriter(v1):
        busy = CliRunner().invoke(cli, ["migrate", "--store", str(v1)])
    assert busy.exit_code == 1 and "open in a StoreWriter" in busy.output


def test_a_v2_stores_tables_become_delta_tables_with_the_same_rows(v2):
    calls = calls_and_sessions(v2)
    report = migrate_store(v2)
    assert (report.from_version, report.sessions, report.current) == (2, 0, 2)
    assert (report.tables, report.table_files) == (COUNTS, FILES)
    assert_migrated(v2)
    assert calls_and_sessions(v2) == calls
    for table in COUNTS:  # one commit each, which made the table and holds every row
        (commit,) = open_table(v2, table).history()
        assert (commit[WRITER_KEY], commit["operationMetrics"]["num_added_rows"]) == ("tracetap migrate", COUNTS[table])
    assert open_table(v2, "trajectories").metadata().partition_columns == ["builder", "session_id"]
    assert [row["reward"] for row in StoreReader(v2).rewards("judge")] == [1.0, None]
    assert read_tasks(v2) == TASKS
    assert migrate_store(v2).tables == {}


def test_a_dry_run_of_a_v2_store_counts_each_table_and_changes_nothing(v2):
    files = snapshot(v2)
    report = migrate_store(v2, dry_run=True)
    assert (report.tables, report.table_files, report.sessions) == (COUNTS, FILES, 0)
    assert snapshot(v2) == files


def test_readers_and_writers_refuse_a_v2_store_naming_migrate(v2):
    message = f"store {v2} has schema version 2: run `tracetap migrate --store {v2}`"
    for opening in (StoreReader, check_store, StoreWriter):
        with pytest.raises(StoreError) as refused:
            opening(v2)
        assert message in str(refused.value)
    listed = CliRunner().invoke(cli, ["sessions", "--store", str(v2)])
    assert listed.exit_code == 2 and "tracetap migrate --store" in listed.output
    assert check_store(v2, older=True) == v2
    migrate_store(v2)
    assert check_store(v2) == v2 and StoreReader(v2).session_ids() == ["s1", "s2"]


def test_an_empty_store_is_still_opened_and_a_store_without_tables_migrates(tmp_path):
    root = tmp_path / "new"
    root.mkdir()
    with StoreWriter(root):
        pass
    assert (root / "VERSION").read_text() == CURRENT and check_store(root) == root
    (root / "VERSION").write_text("2\n")
    (root / "rewards").mkdir()  # a version-2 writer made it; no rows were ever written into it
    report = migrate_store(root)
    assert report.tables == {} and (root / "VERSION").read_text() == CURRENT


def interrupted_after_rename(root: Path) -> None:
    """Killed right after step 1: the old tree renamed to staging, no table yet."""
    os.rename(root / "rewards", root / ".rewards.v2")


def interrupted_mid_write(root: Path) -> None:
    """Killed while writing: staging, and a table holding some rows plus a data file no commit names."""
    os.rename(root / "rewards", root / ".rewards.v2")
    some = rows_to_table("rewards", REWARDS["rewards/session_id=s1/judge.parquet"])
    write_deltalake(table_uri(root, "rewards"), some)
    shutil.copy(root / ".rewards.v2/session_id=s2/judge.parquet", root / "rewards/part-00000-orphan.parquet")


def interrupted_after_commit(root: Path) -> None:
    """Killed after step 2: the whole table committed, its old tree still in staging."""
    old = shutil.copytree(root / "rewards", root.parent / "old-rewards")
    migrate_store(root)
    (root / "VERSION").write_text("2\n")
    os.rename(old, root / ".rewards.v2")


def interrupted_while_deleting(root: Path) -> None:
    """Killed in step 3: the table complete, part of its renamed old tree deleted."""
    old = shutil.copytree(root / "rewards", root.parent / "old-rewards")
    migrate_store(root)
    (root / "VERSION").write_text("2\n")
    shutil.rmtree(old / "session_id=s1")
    os.rename(old, root / ".rewards.v2.done")


def stopped_between_tables(root: Path) -> None:
    """Stopped after the first table was switched (a real run, interrupted from its progress report)."""
    def stop(what: str, rows: int) -> None:
        if what == "table rewards":
            raise KeyboardInterrupt(what)

    with pytest.raises(KeyboardInterrupt):
        migrate_store(root, progress=stop)


@pytest.mark.parametrize("interrupt", [interrupted_after_rename, interrupted_mid_write, interrupted_after_commit,
                                       interrupted_while_deleting, stopped_between_tables])
def test_an_interrupted_table_switch_is_finished_by_running_again(v2, interrupt):
    interrupt(v2)
    assert (v2 / "VERSION").read_text() == "2\n"
    with pytest.raises(StoreError, match="tracetap migrate"):
        StoreReader(v2)
    dry = migrate_store(v2, dry_run=True)
    migrate_store(v2)
    assert_migrated(v2)
    assert dry.tables.get("rewards", COUNTS["rewards"]) == COUNTS["rewards"]


def test_a_file_that_does_not_fit_stops_its_table_before_any_commit_and_a_rerun_finishes(v2):
    bad = v2 / "rewards/session_id=s3/judge.parquet"
    bad.parent.mkdir()
    pq.write_table(pa.table({"session_id": ["s3"], "evaluator": pa.array([None], pa.string())}), bad)
    with pytest.raises(StoreError, match=r"session_id=s3/judge.parquet cannot be migrated: .*evaluator"):
        migrate_store(v2)
    (v2 / ".rewards.v2/session_id=s2/judge.parquet").write_bytes(b"not parquet")
    with pytest.raises(StoreError, match=r"session_id=s2/judge.parquet is not a readable Parquet file"):
        migrate_store(v2, dry_run=True)
    with pytest.raises(StoreError, match=r"session_id=s2/judge.parquet cannot be migrated: .* not a readable"):
        migrate_store(v2)
    assert open_table(v2, "rewards") is None and (v2 / "VERSION").read_text() == "2\n"
    (v2 / ".rewards.v2/session_id=s3/judge.parquet").unlink()
    pq.write_table(rows_to_table("rewards", REWARDS["rewards/session_id=s2/judge.parquet"]),
                   v2 / ".rewards.v2/session_id=s2/judge.parquet")
    migrate_store(v2)
    assert_migrated(v2)


def test_a_table_holding_both_layouts_is_refused_not_half_migrated(v2):
    """A version-3 writer that wrote into a version-2 store left a Delta table among the old files."""
    write_deltalake(table_uri(v2, "rollouts"), rows_to_table("rollouts", [
        {"task_id": "t3", "request_json": "{}", "result_json": "{}"}]))
    files = snapshot(v2)
    for dry_run in (True, False):
        with pytest.raises(StoreError, match="rollouts holds both a Delta table and files of the old layout"):
            migrate_store(v2, dry_run=dry_run)
    assert snapshot(v2) == files


def test_the_command_reports_each_table(v2):
    dry = CliRunner().invoke(cli, ["migrate", "--store", str(v2), "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output) | {"migrated": None} == {
        "from_version": 2, "sessions": 0, "rows": 0, "files": 0, "current": 2, "migrated": None,
        "tables": COUNTS, "table_files": FILES, "dry_run": True}
    done = CliRunner().invoke(cli, ["migrate", "--store", str(v2)])
    assert done.exit_code == 0, done.output
    assert done.output.splitlines() == [
        "table rewards: rewrote 3 row(s)", "table trajectories: rewrote 4 row(s)", "table rollouts: rewrote 2 row(s)",
        "migrated 0 session(s), 0 row(s) in 0 file(s) from schema version 2; 2 session(s) already current; "
        "rewards: 3 row(s) from 3 file(s); trajectories: 4 row(s) from 3 file(s); rollouts: 2 row(s) from 2 file(s)"]
    assert_migrated(v2)


@pytest.mark.parametrize("form", ["v1-migrated", "v2-migrated"])
def test_the_store_forms_the_read_side_suites_run_on_read_the_same(tmp_path, form):
    """scripts/test.sh runs the read-side suites on stores rewritten by tests/store_forms.py: check that a
    rewrite lands in the current version and layout and reads as what the writers recorded."""
    root = make_store(tmp_path / "store")
    save_task(root, "t1", "completed", TASKS["t1"]["request"], TASKS["t1"]["result"])
    before = everything(root, tmp_path, ["s1", "s2", "s3"])
    tables = {table: table_rows(root, table) for table in COUNTS}
    as_form(root, form)
    after = {table: table_rows(root, table) for table in COUNTS}
    assert (root / "VERSION").read_text() == CURRENT
    files = sorted(root.glob("completions/*/*.parquet"))
    if form == "v1-migrated":  # a v1 store had one part a session and no log; a v2 store is as recorded
        assert [f.name for f in files] == ["part-4.parquet", "part-3.parquet", "part-2.parquet"]
        assert not (root / "log").exists()
    assert all(("prompt_suffix_ids" in pq.read_schema(f).names) for f in files)
    assert not any(pq.read_schema(f).equals(V1_SCHEMA) for f in files)
    assert everything(root, tmp_path, ["s1", "s2", "s3"]) == before
    for row in [*tables["rollouts"], *after["rollouts"]]:
        row.pop("updated_at")  # the old layout kept none: a migrated task's is its file's time
    assert after == tables and len(tables["rewards"]) == 3 and len(tables["rollouts"]) == 1


def test_tracetaps_own_writers_refuse_a_store_not_yet_migrated(v2):
    files = snapshot(v2)
    for write in (lambda: save_task(v2, "t9", "running", {}, {}),
                  lambda: write_session_table(v2, "rewards", "s1", [{"reward": 1.0}], evaluator="late")):
        with pytest.raises(StoreError, match="run `tracetap migrate"):
            write()
    assert snapshot(v2) == files
