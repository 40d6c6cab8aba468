"""Older stores brought to the current schema version by `tracetap migrate`, and refused until then.

A schema-version-1 store (tests/fixtures/store-v1) has its completions as full rows in part and per-call
files; a version-2 store (made here, in the layout tests/store_forms.py writes) has them in the compact
form, some only in the log a dead gateway left, and every other table as a tree of files too. Each
table becomes a Delta table with the rows the old store showed. Migrations are interrupted (stopped,
killed, or left in each crash state of a table's switch) and finished by running them again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from deltalake import write_deltalake
from sample_store import make_store
from store_forms import (
    V1_SCHEMA,
    V1_SESSIONS,
    append_log,
    as_form,
    stored_rows,
    write_part,
    write_per_call,
    write_sessions,
)
from store_rows import completion, log_names, snapshot
from tracetap.builders.exports import export
from tracetap.builders.runner import build
from tracetap.store import (
    SCHEMA_VERSION,
    StoreError,
    StoreReader,
    StoreWriter,
    check_store,
    connect,
    migrate_store,
    read_tasks,
    save_task,
    scan,
    write_session_table,
)
from tracetap.store.delta import DELTA_TABLES, WRITER_KEY, committed_seqs, open_table, read, storage_schema, table_uri
from tracetap.store.reading import read_sessions
from tracetap.store.schema import COMPLETIONS
from tracetap.store.tables import rows_to_table

from tracetap.cli import cli

FIXTURE = Path(__file__).parents[1] / "fixtures" / "store-v1"
V1_COUNTS, V1_FILES = {"completions": 13, "sessions": 3}, {"completions": 7, "sessions": 3}
CURRENT = f"{SCHEMA_VERSION}\n"
AT = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)
SUPERSEDED = "a superseded copy: no reader ever showed it"
DELTA_FILE = re.compile(r"part-\d{5}-[0-9a-f-]{36}-c\d{3}\.zstd\.parquet")  # deltalake's data files

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
CALLS = {"s1": 5, "s2": 2, "s3": 3}  # the version-2 store's calls per session
COUNTS = {"completions": 10, "sessions": 3, "rewards": 3, "trajectories": 4, "rollouts": 2}
FILES = {"completions": 4, "sessions": 3, "rewards": 3, "trajectories": 3, "rollouts": 2}
KEYS = {"rewards": ["session_id", "evaluator"], "trajectories": ["builder", "session_id", "trace_index"],
        "rollouts": ["task_id"]}


def fixture_rows() -> dict[str, list[dict]]:
    """What a version-1 reader showed of the fixture: each session's files (all of them: no part supersedes
    a per-call file there), its rows in seq order."""
    rows = {}
    for directory in sorted(FIXTURE.glob("completions/session_id=*")):
        files = [pq.ParquetFile(path).read().cast(V1_SCHEMA) for path in sorted(directory.glob("*.parquet"))]
        rows[directory.name.removeprefix("session_id=")] = pa.concat_tables(files).sort_by("seq").to_pylist()
    return rows


def fixture_sessions() -> list[dict]:
    return [pq.ParquetFile(path).read().to_pylist()[0] for path in sorted(FIXTURE.glob("sessions/*/session.parquet"))]


@pytest.fixture
def v1(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURE, tmp_path / "store"))


@pytest.fixture
def reference(tmp_path: Path) -> Path:
    """The v1 fixture's rows recorded by today's writer: a store that reads as the fixture did."""
    root = tmp_path / "reference"
    with StoreWriter(root) as writer:
        for session, rows in zip(fixture_sessions(), fixture_rows().values(), strict=True):
            metadata = json.loads(session["metadata_json"] or "{}")
            writer.register_session(session["session_id"], session["task_id"], session["harness"], metadata)
            for row in rows:
                writer.record_completion({name: value for name, value in row.items() if name != "seq"})
    return root


def prompt(i: int) -> list[int]:
    """Call i's prompt extends call i - 1's prompt and sampled ids ([4, 5]) by more than compact_form's
    MIN_SHARED tokens: stored as a reference to it."""
    return list(range(100, 200)) + [4, 5] * i


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    """The version-2 store's calls and sessions, recorded by today's writer: what it must read as."""
    root = tmp_path / "recorded"
    with StoreWriter(root) as writer:
        for sid, calls in CALLS.items():
            writer.register_session(sid, task_id="t1", harness="codex")
            for i in range(calls):
                writer.record_completion(completion(sid, prompt_token_ids=prompt(i), completion_id=f"{sid}-{i}"))
    return root


def superseded(row: pa.Table) -> pa.Table:
    """A copy of a stored row a version-2 reader hid, changed so a reader showing it would be caught."""
    return row.set_column(row.schema.get_field_index("error"), "error", pa.array([SUPERSEDED]))


@pytest.fixture
def v2(tmp_path: Path, recorded: Path) -> Path:
    """A version-2 store as a gateway killed while compacting left it: s1's part-3 (seqs 0-2), the per-call
    file of seq 1 it superseded, the per-call file of seq 3; the log holding seq 2 (which the part covers),
    s1's seq 4 and all of s2; s3 compacted whole. Rewards, trajectories and rollouts in their file layouts."""
    root = tmp_path / "v2"
    root.mkdir()
    (root / ".writer.lock").touch()  # its gateway's
    calls = stored_rows(recorded)
    s1 = calls["s1"]
    write_part(root, "s1", s1.slice(0, 3))
    write_per_call(root, superseded(s1.slice(1, 1)))
    write_per_call(root, s1.slice(3, 1))
    append_log(root, pa.concat_tables([superseded(s1.slice(2, 1)), s1.slice(4, 1), calls["s2"]]))
    write_part(root, "s3", calls["s3"])
    write_sessions(root, read_sessions(recorded))
    for path, rows in {**REWARDS, **TRAJECTORIES}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows_to_table(path.split("/")[0], rows), root / path)
    for task_id, body in TASKS.items():
        (root / f"rollouts/task_id={task_id}").mkdir(parents=True)
        (root / f"rollouts/task_id={task_id}/task.json").write_text(json.dumps(body, indent=1))
        os.utime(root / f"rollouts/task_id={task_id}/task.json", (AT.timestamp(), AT.timestamp()))
    (root / "VERSION").write_text("2\n")
    return root


def everything(root: Path, out: Path, sessions: list[str]) -> dict:
    """What readers give: builds and exports, the completions view, the Python reader, the Polars scan."""
    exports = {}
    for builder in ("per_request", "prefix_merging"):
        build(root, builder)
        export(root, builder, "jsonl", out / f"{builder}.jsonl", force=True)
        exports[builder] = (out / f"{builder}.jsonl").read_bytes()
    columns = ", ".join(f'"{name}"' for name in COMPLETIONS.names)
    view = connect(root).execute(f"SELECT {columns}, chain_index, side_call FROM completions "
                                 "ORDER BY session_id, seq").fetchall()
    python = shown_rows(root, sessions)
    frame = scan(root, "completions").sort(["session_id", "seq"]).collect().rows()
    return {"view": view, "python": python, "scan": frame, "exports": exports}


def shown_rows(root: Path, sessions: list[str], columns: list[str] | None = None) -> dict[str, list[dict]]:
    """The completions the Python reader shows, by session."""
    return {sid: rows.to_pylist() for sid, rows in StoreReader(root).completions_of(sessions, columns).items()}


def session_rows(root: Path) -> list[dict]:
    """The sessions rows readers show, without `revision` (version 2 kept none)."""
    return [{name: value for name, value in row.items() if name != "revision"} for row in StoreReader(root).sessions()]


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


def assert_delta_only(root: Path) -> None:
    """Every table a Delta table and nothing else: each data file on disk one deltalake wrote (the old
    layout's gone), every file its version names there; no task.json or staging tree is left, VERSION is
    current."""
    for table in DELTA_TABLES:
        delta = open_table(root, table)
        named = set() if delta is None else {Path(uri.removeprefix("file://")) for uri in delta.file_uris()}
        on_disk = set((root / table).rglob("*.parquet"))
        assert named <= on_disk and all(DELTA_FILE.fullmatch(path.name) for path in on_disk), table
    assert not list(root.glob("rollouts/**/task.json"))
    assert sorted(name for name in os.listdir(root) if name.startswith(".") and name != ".writer.lock") == []
    assert (root / "VERSION").read_text() == CURRENT


def assert_compact(root: Path, sid: str, calls: int, chained: bool = True) -> None:
    """The table holds the session's calls in the compact form: no prompt whole (`chained`: each one a
    reference to the call before)."""
    rows = read(open_table(root, "completions"), "completions", session_ids=[sid]).sort_by("seq").to_pylist()
    assert [row["seq"] for row in rows] == list(range(calls))
    assert all(row["prompt_token_ids"] is None and row["prompt_suffix_ids"] is not None for row in rows)
    if chained:
        assert [row["prompt_ref_seq"] for row in rows] == [None, *range(calls - 1)]


def assert_migrated(root: Path, recorded: Path) -> None:
    """The version-2 fixture's rows, each once, read back from Delta tables alone: completions as recorded
    (the superseded copies never), in the compact form; sessions as they were; the other tables' rows."""
    assert_delta_only(root)
    sids = list(CALLS)
    assert shown_rows(root, sids) == shown_rows(recorded, sids)
    assert committed_seqs(open_table(root, "completions")) == CALLS
    assert read(open_table(root, "completions"), "completions").num_rows == COUNTS["completions"]
    assert SUPERSEDED not in str(connect(root).execute("SELECT error FROM completions").fetchall())
    assert_compact(root, "s1", CALLS["s1"])
    assert session_rows(root) == session_rows(recorded)
    for table in KEYS:
        assert table_rows(root, table) == expected_rows(table), table


def test_a_v1_store_is_refused_until_migrated_then_reads_as_its_rows_did(v1, reference, tmp_path):
    before = everything(reference, tmp_path, list(fixture_rows()))
    with pytest.raises(StoreError, match="schema version 1: run `tracetap migrate --store"):
        StoreReader(v1)
    report = migrate_store(v1)
    assert (report.from_version, report.tables, report.table_files) == (1, V1_COUNTS, V1_FILES)
    assert_delta_only(v1)
    reader = StoreReader(v1)
    assert shown_rows(v1, list(fixture_rows()), V1_SCHEMA.names) == fixture_rows()
    assert_compact(v1, "linear", 5)
    assert [{name: row[name] for name in V1_SESSIONS.names} for row in reader.sessions()] == fixture_sessions()
    assert everything(v1, tmp_path, list(fixture_rows())) == before
    again = migrate_store(v1)
    assert (again.from_version, again.tables) == (SCHEMA_VERSION, {})


def test_a_dry_run_of_a_v1_store_counts_and_changes_nothing(v1):
    files = snapshot(v1)
    report = migrate_store(v1, dry_run=True)
    assert (report.from_version, report.tables, report.table_files) == (1, V1_COUNTS, V1_FILES)
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
    assert StoreReader(v1).session("loose")["completions"] == 4


def test_a_migration_stopped_between_tables_finishes_when_run_again(v1, reference, tmp_path):
    before = everything(reference, tmp_path, list(fixture_rows()))

    def stop(what: str, rows: int) -> None:
        raise KeyboardInterrupt(what)

    with pytest.raises(KeyboardInterrupt, match="table completions"):
        migrate_store(v1, progress=stop)
    assert (v1 / "VERSION").read_text() == "1\n"
    with pytest.raises(StoreError, match="tracetap migrate"):
        StoreReader(v1)
    report = migrate_store(v1)
    assert report.tables == {"sessions": 3}
    assert len(open_table(v1, "completions").history()) == 1  # switched once, not again
    assert everything(v1, tmp_path, list(fixture_rows())) == before


def test_a_killed_migration_finishes_when_run_again(v1, reference, tmp_path):
    before = everything(reference, tmp_path, list(fixture_rows()))
    with subprocess.Popen([sys.executable, "-m", "tracetap.cli", "migrate", "--store", str(v1)],
                          stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout.readline() == "table completions: rewrote 13 row(s)\n"
        os.kill(process.pid, signal.SIGKILL)
    migrate_store(v1)
    assert_delta_only(v1)
    assert everything(v1, tmp_path, list(fixture_rows())) == before


def test_the_command_prints_counts_and_refuses_a_store_with_a_writer(v1):
    dry = CliRunner().invoke(cli, ["migrate", "--store", str(v1), "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output) == {"from_version": 1, "tables": V1_COUNTS, "table_files": V1_FILES,
                                      "dry_run": True}
    said = CliRunner().invoke(cli, ["migrate", "--store", str(v1), "--dry-run"])
    assert said.output.splitlines() == [
        "table completions: would rewrite 13 row(s)", "table sessions: would rewrite 3 row(s)",
        "would migrate the store from schema version 1; completions: 13 row(s) from 7 file(s); "
        "sessions: 3 row(s) from 3 file(s)"]
    assert (v1 / "VERSION").read_text() == "1\n"
    done = CliRunner().invoke(cli, ["migrate", "--store", str(v1)])
    assert done.exit_code == 0, done.output
    assert done.output.splitlines() == [
        "table completions: rewrote 13 row(s)", "table sessions: rewrote 3 row(s)",
        "migrated the store from schema version 1; completions: 13 row(s) from 7 file(s); "
        "sessions: 3 row(s) from 3 file(s)"]
    with StoreWriter(v1):
        busy = CliRunner().invoke(cli, ["migrate", "--store", str(v1)])
    assert busy.exit_code == 1 and "open in a StoreWriter" in busy.output


def test_a_v2_stores_tables_become_delta_tables_with_the_same_rows(v2, recorded):
    report = migrate_store(v2)
    assert (report.from_version, report.tables, report.table_files) == (2, COUNTS, FILES)
    assert_migrated(v2, recorded)
    assert log_names(v2) == []  # the dead gateway's log: every row of it is in the table, or was hidden
    for table in DELTA_TABLES:  # one commit each, which made the table and holds every row
        (commit,) = open_table(v2, table).history()
        assert (commit[WRITER_KEY], commit["operationMetrics"]["num_added_rows"]) == ("tracetap migrate", COUNTS[table])
    assert open_table(v2, "completions").metadata().partition_columns == ["session_id"]
    assert open_table(v2, "trajectories").metadata().partition_columns == ["builder", "session_id"]
    assert [row["reward"] for row in StoreReader(v2).rewards("judge")] == [1.0, None]
    assert read_tasks(v2) == TASKS
    assert migrate_store(v2).tables == {}


def test_a_dry_run_of_a_v2_store_counts_what_a_migration_rewrites_and_changes_nothing(v2):
    files = snapshot(v2)
    dry = migrate_store(v2, dry_run=True)
    assert snapshot(v2) == files
    assert (dry.from_version, dry.table_files) == (2, FILES)
    assert dry.tables == COUNTS  # the log's copy of a row the part covers is not rewritten: not counted


@pytest.mark.parametrize("old", ["v1", "v2"])
def test_readers_and_writers_refuse_an_older_store_naming_migrate(request, old):
    root = request.getfixturevalue(old)
    message = f"store {root} has schema version {old[1]}: run `tracetap migrate --store {root}`"
    for opening in (StoreReader, check_store, StoreWriter):
        with pytest.raises(StoreError) as refused:
            opening(root)
        assert message in str(refused.value)
    listed = CliRunner().invoke(cli, ["sessions", "--store", str(root)])
    assert listed.exit_code == 2 and "tracetap migrate --store" in listed.output
    assert check_store(root, older=True) == root
    migrate_store(root)
    assert check_store(root) == root


def test_a_writer_continues_the_sessions_of_a_migrated_v2_store(v2):
    migrate_store(v2)
    with StoreWriter(v2) as writer:
        assert [writer.record_completion(completion(sid))["seq"] for sid in CALLS] == list(CALLS.values())
    assert StoreReader(v2).session_ids() == list(CALLS)
    assert [row["completions"] for row in StoreReader(v2).sessions()] == [calls + 1 for calls in CALLS.values()]
    assert log_names(v2) == []


@pytest.fixture
def v3(recorded: Path) -> Path:
    """A version-3 store: the Delta tables without ownership chains (and the old writer's lock file)."""
    with StoreWriter(recorded) as writer:
        writer.register_session("waiting", task_id="t2", harness="codex")  # a row and no call
    for made_since in ("owners", "writers"):
        shutil.rmtree(recorded / made_since)
    (recorded / ".writer.lock").touch()
    (recorded / "VERSION").write_text("3\n")
    return recorded


def test_a_v3_store_gets_a_chain_for_each_session_and_a_writer_continues_them(v3):
    with pytest.raises(StoreError, match="has schema version 3: run `tracetap migrate"):
        StoreWriter(v3)
    assert migrate_store(v3).tables == {}  # its tables are Delta tables already
    assert sorted(path.name for path in (v3 / "owners").iterdir()) == [*CALLS, "waiting"]
    with StoreWriter(v3) as writer:
        assert [writer.record_completion(completion(sid))["seq"] for sid in CALLS] == list(CALLS.values())
        assert writer.record_completion(completion("waiting"))["seq"] == 0
    assert StoreReader(v3).session("waiting")["task_id"] == "t2"  # loaded, not started anew


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


def _staged(root: Path, table: str) -> Path:
    """Step 1 of a switch: the old tree renamed to its staging name."""
    staging = root / f".{table}.v2"
    os.rename(root / table, staging)
    return staging


def interrupted_after_rename(root: Path, table: str) -> None:
    """Killed right after step 1: the old tree renamed to staging, no table yet."""
    _staged(root, table)


def interrupted_mid_write(root: Path, table: str) -> None:
    """Killed while writing: staging, and a table holding some rows plus a data file no commit names."""
    old = sorted(_staged(root, table).rglob("*.parquet"))
    some = rows_to_table(table, pq.ParquetFile(old[0]).read().to_pylist())
    write_deltalake(table_uri(root, table), some.cast(storage_schema(table)),
                    partition_by=list(DELTA_TABLES[table]) or None)
    shutil.copy(old[-1], root / table / "part-00000-orphan.parquet")


def interrupted_after_commit(root: Path, table: str) -> None:
    """Killed after step 2: the whole table committed, its old tree still in staging (and the log whole)."""
    migrated = Path(shutil.copytree(root, root.parent / "migrated"))
    migrate_store(migrated)
    _staged(root, table)
    os.rename(migrated / table, root / table)


def interrupted_while_deleting(root: Path, table: str) -> None:
    """Killed in step 3: the table complete, its old tree renamed `.done`, part of that deleted (completions:
    the log segments not deleted yet)."""
    interrupted_after_commit(root, table)
    done = root / f".{table}.v2.done"
    os.rename(root / f".{table}.v2", done)
    shutil.rmtree(sorted(done.iterdir())[0])


def stopped_after_the_table(root: Path, table: str) -> None:
    """Stopped once the table was switched (a real run, interrupted from its progress report)."""
    def stop(what: str, rows: int) -> None:
        if what == f"table {table}":
            raise KeyboardInterrupt(what)

    with pytest.raises(KeyboardInterrupt):
        migrate_store(root, progress=stop)


INTERRUPTIONS: list[Callable[[Path, str], None]] = [interrupted_after_rename, interrupted_mid_write,
                                                    interrupted_after_commit, interrupted_while_deleting,
                                                    stopped_after_the_table]


@pytest.mark.parametrize("table", ["completions", "rewards"])
@pytest.mark.parametrize("interrupt", INTERRUPTIONS)
def test_an_interrupted_table_switch_is_finished_by_running_again(v2, recorded, interrupt, table):
    interrupt(v2, table)
    assert (v2 / "VERSION").read_text() == "2\n"
    with pytest.raises(StoreError, match="tracetap migrate"):
        StoreReader(v2)
    dry = migrate_store(v2, dry_run=True)
    report = migrate_store(v2)
    assert_migrated(v2, recorded)  # each row once: none lost, none doubled
    assert report.tables.get(table, COUNTS[table]) == COUNTS[table]
    assert dry.tables.get(table) == report.tables.get(table)
    with StoreWriter(v2):
        pass  # a writer commits what a log left behind holds that the table lacks (nothing), then deletes it
    assert log_names(v2) == []
    assert_migrated(v2, recorded)


def test_a_file_that_does_not_fit_stops_its_table_before_any_commit_and_a_rerun_finishes(v2, recorded):
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
    assert_migrated(v2, recorded)


def newer_rows(root: Path, table: str) -> pa.Table:
    """Rows a newer tracetap could have committed to `table` (a copy of an old file's, or a new task)."""
    if table == "rollouts":
        return rows_to_table(table, [{"task_id": "t3", "request_json": "{}", "result_json": "{}"}])
    return rows_to_table(table, pq.ParquetFile(sorted((root / table).rglob("*.parquet"))[0]).read().to_pylist())


@pytest.mark.parametrize("table", ["completions", "sessions", "rollouts"])
def test_a_table_holding_both_layouts_is_refused_not_half_migrated(v2, table):
    """A version-3 writer that wrote into a version-2 store left a Delta table among the old files."""
    write_deltalake(table_uri(v2, table), newer_rows(v2, table).cast(storage_schema(table)),
                    partition_by=list(DELTA_TABLES[table]) or None)
    files = snapshot(v2)
    for dry_run in (True, False):
        with pytest.raises(StoreError, match=f"{table} holds both a Delta table and files of the old layout"):
            migrate_store(v2, dry_run=dry_run)
    assert snapshot(v2) == files


def test_the_command_reports_each_table(v2, tmp_path):
    copy = shutil.copytree(v2, tmp_path / "copy")
    as_json = CliRunner().invoke(cli, ["migrate", "--store", str(v2), "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.output) == {"from_version": 2, "tables": COUNTS, "table_files": FILES, "dry_run": False}
    done = CliRunner().invoke(cli, ["migrate", "--store", str(copy)])
    assert done.exit_code == 0, done.output
    assert done.output.splitlines() == [
        "table completions: rewrote 10 row(s)", "table sessions: rewrote 3 row(s)", "table rewards: rewrote 3 row(s)",
        "table trajectories: rewrote 4 row(s)", "table rollouts: rewrote 2 row(s)",
        "migrated the store from schema version 2; completions: 10 row(s) from 4 file(s); sessions: 3 row(s) from "
        "3 file(s); rewards: 3 row(s) from 3 file(s); trajectories: 4 row(s) from 3 file(s); rollouts: 2 row(s) "
        "from 2 file(s)"]
    again = CliRunner().invoke(cli, ["migrate", "--store", str(copy)])
    assert again.output == f"migrated the store from schema version {SCHEMA_VERSION}; nothing to switch\n"


@pytest.mark.parametrize("form", ["v1-migrated", "v2-migrated"])
def test_the_store_forms_the_read_side_suites_run_on_read_the_same(tmp_path, form):
    """scripts/test.sh runs the read-side suites on stores rewritten by tests/store_forms.py: check that a
    rewrite lands in the current version and layout and reads as what the writers recorded."""
    root = make_store(tmp_path / "store")
    save_task(root, "t1", "completed", TASKS["t1"]["request"], TASKS["t1"]["result"])
    sids = ["s1", "s2", "s3"]
    before = everything(root, tmp_path, sids)
    tables = {table: table_rows(root, table) for table in KEYS}
    sessions = session_rows(root)
    as_form(root, form)
    assert_delta_only(root)
    assert log_names(root) == []
    assert_compact(root, "s1", 4, chained=False)  # s2 and s3 end in failed calls, which have no prompt ids
    assert everything(root, tmp_path, sids) == before
    assert session_rows(root) == sessions
    after = {table: table_rows(root, table) for table in KEYS}
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
