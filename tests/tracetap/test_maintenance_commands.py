"""`tracetap history` and `tracetap vacuum` through click's runner, on a real store with Delta tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from tracetap.store import StoreWriter, write_session_table

from tracetap.cli import cli


def run(*args: str, code: int = 0):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """rewards: created, s1's reward written, then replaced (versions 0-2); trajectories: versions 0-1."""
    root = tmp_path / "store"
    with StoreWriter(root):
        pass
    for value in (0.5, 1.0):
        write_session_table(root, "rewards", "s1", [{"reward": value}], evaluator="e", writer="tracetap evaluate")
    write_session_table(root, "trajectories", "s1", [{"trace_index": 0}, {"trace_index": 1}], builder="b",
                        writer="tracetap build")
    return root


def files(root: Path) -> set[Path]:
    return {path for path in root.rglob("*.parquet") if "_delta_log" not in path.parts}


def test_history_prints_a_line_per_version(store):
    lines = run("history", "--store", str(store)).stdout.splitlines()
    assert lines[0].split() == ["table", "version", "time", "operation", "writer", "rows_added", "files_added",
                                "files_removed", "read_versions"]
    assert lines[-1] == "(5 rows)" and len(lines) == 2 + 5 + 1
    newest = lines[2].split()
    assert newest[:2] == ["rewards", "2"] and newest[2].endswith("+00:00")
    assert newest[3:] == ["WRITE", "tracetap", "evaluate", "1", "1", "1"]
    assert lines[4].split()[:4] == ["rewards", "0", lines[4].split()[2], "CREATE"]
    assert "tracetap build" in lines[5] and lines[5].split()[1] == "1"


def test_history_json_of_one_table_limited(store):
    versions = json.loads(run("history", "--store", str(store), "--table", "trajectories", "--limit", "1",
                              "--json").stdout)
    assert len(versions) == 1
    only = versions[0]
    assert only.pop("time").endswith("+00:00")
    assert only == {"table": "trajectories", "version": 1, "operation": "WRITE", "writer": "tracetap build",
                    "rows_added": 2, "files_added": 1, "files_removed": 0, "read_versions": None}


def test_vacuum_dry_run_then_vacuum_without_retention(store):
    before = files(store)
    assert run("vacuum", "--store", str(store), "--retain", "0", "--dry-run").stdout.splitlines() == [
        "rewards: would delete 1 file(s)", "trajectories: would delete 0 file(s)"]
    assert files(store) == before
    report = json.loads(run("vacuum", "--store", str(store), "--retain", "0", "--json").stdout)
    (removed,) = report["removed"]["rewards"]
    assert report == {"retain_hours": 0, "dry_run": False, "removed": {"rewards": [removed], "trajectories": []}}
    assert files(store) == before - {store / "rewards" / removed}
    assert "VACUUM END" in run("history", "--store", str(store), "--table", "rewards", "--limit", "1").stdout


def test_vacuum_keeps_a_week_by_default(store):
    before = files(store)
    assert json.loads(run("vacuum", "--store", str(store), "--json").stdout) == {
        "retain_hours": 168, "dry_run": False, "removed": {"rewards": [], "trajectories": []}}
    assert files(store) == before


def test_a_store_without_delta_tables(tmp_path):
    with StoreWriter(tmp_path / "store"):
        pass
    assert run("vacuum", "--store", str(tmp_path / "store")).stdout.strip() == "no Delta tables yet: nothing to vacuum"
    assert json.loads(run("history", "--store", str(tmp_path / "store"), "--json").stdout) == []


@pytest.mark.parametrize("args, message", [
    (["history", "--store", "{tmp}/missing"], "does not exist"),
    (["vacuum", "--store", "{tmp}/missing"], "does not exist"),
    (["history", "--store", "{tmp}"], "not a tracetap store"),
    (["vacuum", "--store", "{tmp}", "--dry-run"], "not a tracetap store"),
    (["history", "--store", "{store}", "--table", "nope"], "unknown Delta table(s) nope"),
    (["history", "--store", "{store}", "--limit", "0"], "--limit"),
    (["vacuum", "--store", "{store}", "--retain", "-1"], "--retain"),
])
def test_usage_errors_name_the_problem(store, tmp_path, args, message):
    result = run(*[arg.format(tmp=tmp_path, store=store) for arg in args], code=2)
    assert message in result.stderr


def test_a_damaged_log_exits_1_naming_the_table(store):
    (store / "rewards" / "_delta_log" / "00000000000000000003.json").write_text("not json{")
    for command in ("history", "vacuum"):
        assert "Error: Delta table rewards: " in run(command, "--store", str(store), code=1).stderr
