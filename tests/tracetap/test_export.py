"""`tracetap export` through click's runner on a real store."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable
from sample_store import TRAJECTORIES, make_store

from tracetap.cli import cli

TRACES = sum(len(traces) for traces in TRAJECTORIES.values())


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return str(make_store(tmp_path_factory.mktemp("cli-export") / "store"))


def run(*args: str, code: int = 0):
    result = CliRunner().invoke(cli, ["export", *args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def test_parquet_with_rewards_and_budget(store, tmp_path):
    out = tmp_path / "train.parquet"
    result = run("--store", store, "--builder", "prefix_merging", "--format", "parquet", "--out", str(out),
                 "--evaluator", "session_completed", "--max-tokens", "14", "--json")
    summary = json.loads(result.stdout)
    assert (summary["sessions"], summary["traces"], summary["dropped_over_budget"], summary["clipped"]) == (
        3, TRACES, 1, 1)
    assert pq.read_table(out).num_rows == summary["written"] == TRACES - 1
    versions = {table: DeltaTable(str(Path(store) / table)).version() for table in ("trajectories", "rewards")}
    assert {t: summary["table_versions"][t] for t in versions} == versions  # what a rebuild pins


def test_atif_directory_and_text_summary(store, tmp_path):
    result = run("--store", store, "--builder", "prefix_merging", "--format", "atif",
                 "--out", str(tmp_path / "a"))
    assert f"wrote {TRACES} trace(s) of 3 session(s)" in result.stdout
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["s1.json", "s2.json", "s3.json"]


def test_existing_output_needs_force(store, tmp_path):
    out = tmp_path / "x.jsonl"
    out.write_text("keep me")
    args = ["--store", store, "--builder", "prefix_merging", "--format", "jsonl", "--out", str(out)]
    assert "already exists (use --force" in run(*args, code=1).output
    assert out.read_text() == "keep me"
    run(*args, "--force")
    assert len(out.read_text().splitlines()) == TRACES


@pytest.mark.parametrize("args, code, message", [
    (["--builder", "per_request", "--format", "parquet"], 1, "no trajectories of builder 'per_request'"),
    (["--builder", "prefix_merging", "--format", "csv"], 2, "'csv' is not one of"),
    (["--builder", "prefix_merging", "--format", "atif", "--max-tokens", "9"], 1, "token-level format"),
    (["--builder", "prefix_merging", "--format", "parquet", "--max-tokens", "0"], 2, "--max-tokens"),
    (["--builder", "prefix_merging", "--format", "jsonl", "--evaluator", "a/b"], 1, "invalid evaluator name"),
])
def test_errors(store, tmp_path, args, code, message):
    assert message in run("--store", store, *args, "--out", str(tmp_path / "out"), code=code).output
    assert not (tmp_path / "out").exists()
