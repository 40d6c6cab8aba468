"""A schema-version-1 store (tests/fixtures/store-v1): read as is, migrated in place, interrupted and resumed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from sample_store import make_store
from store_forms import V1_SCHEMA, as_form
from store_rows import snapshot
from tracetap.builders.exports import export
from tracetap.builders.runner import build
from tracetap.store import StoreError, StoreWriter, connect, migrate_store, scan
from tracetap.store.paths import session_dir
from tracetap.store.reading import read_session
from tracetap.store.schema import COMPLETIONS

from tracetap.cli import cli

FIXTURE = Path(__file__).parents[1] / "fixtures" / "store-v1"
SESSIONS = ["linear", "loose", "mixed"]
ROWS = 13


@pytest.fixture
def v1(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURE, tmp_path / "store"))


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


def test_a_v1_store_reads_as_is_and_the_same_after_migrating(v1, tmp_path):
    before = everything(v1, tmp_path)
    assert len(before["view"]) == ROWS and before["view"][4][1] == 4 and before["view"][4][-2] == 0
    assert before["python"]["linear"][4]["prompt_token_ids"][:3] == [1000, 1001, 1002]
    report = migrate_store(v1)
    assert (report.from_version, report.sessions, report.rows, report.files) == (1, 3, ROWS, 7)
    assert (v1 / "VERSION").read_text() == "2\n"
    assert sorted(p.name for p in v1.glob("completions/*/*.parquet")) == ["part-3.parquet", "part-5.parquet",
                                                                         "part-5.parquet"]
    assert everything(v1, tmp_path) == before
    again = migrate_store(v1)
    assert (again.sessions, again.current) == (0, 3)


def test_a_dry_run_counts_and_changes_nothing(v1):
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


def test_a_migration_stopped_between_sessions_leaves_a_readable_store_and_finishes_when_run_again(v1, tmp_path):
    before = everything(v1, tmp_path)

    def stop(sid: str, rows: int) -> None:
        raise KeyboardInterrupt(sid)

    with pytest.raises(KeyboardInterrupt):
        migrate_store(v1, progress=stop)
    assert (v1 / "VERSION").read_text() == "1\n"
    assert everything(v1, tmp_path) == before
    report = migrate_store(v1)
    assert (report.sessions, report.current) == (2, 1)
    assert everything(v1, tmp_path) == before


def test_a_killed_migration_leaves_a_readable_store(v1, tmp_path):
    before = everything(v1, tmp_path)
    with subprocess.Popen([sys.executable, "-m", "tracetap.cli", "migrate", "--store", str(v1)],
                          stdout=subprocess.PIPE, text=True) as process:
        process.stdout.readline()  # one session rewritten
        os.kill(process.pid, signal.SIGKILL)
    assert everything(v1, tmp_path) == before
    migrate_store(v1)
    assert (v1 / "VERSION").read_text() == "2\n" and everything(v1, tmp_path) == before


def test_the_command_prints_counts_and_refuses_a_store_with_a_writer(v1):
    dry = CliRunner().invoke(cli, ["migrate", "--store", str(v1), "--dry-run", "--json"])
    assert dry.exit_code == 0 and json.loads(dry.output)["rows"] == ROWS and (v1 / "VERSION").read_text() == "1\n"
    done = CliRunner().invoke(cli, ["migrate", "--store", str(v1)])
    assert done.exit_code == 0 and "migrated 3 session(s), 13 row(s) in 7 file(s)" in done.output
    with StoreWriter(v1):
        busy = CliRunner().invoke(cli, ["migrate", "--store", str(v1)])
    assert busy.exit_code == 1 and "open in a StoreWriter" in busy.output


@pytest.mark.parametrize("form", ["v1", "v1-migrated"])
def test_the_store_forms_the_read_side_suites_run_on_read_the_same(tmp_path, form):
    """scripts/test.sh runs the read-side suites on stores rewritten by tests/store_forms.py: check that a
    rewrite gives the version it names, in its layout, and reads as what the writer recorded."""
    root = make_store(tmp_path / "store")
    before = everything(root, tmp_path, ["s1", "s2", "s3"])
    as_form(root, form)
    version, parts = ("1", V1_SCHEMA) if form == "v1" else ("2", None)
    assert (root / "VERSION").read_text() == f"{version}\n" and not (root / "log").exists()
    files = sorted(root.glob("completions/*/*.parquet"))
    assert [f.name for f in files] == ["part-4.parquet", "part-3.parquet", "part-2.parquet"]
    assert parts is None or all(pq.read_schema(f).equals(parts) for f in files)
    assert everything(root, tmp_path, ["s1", "s2", "s3"]) == before
