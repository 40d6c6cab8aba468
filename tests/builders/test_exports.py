"""Exports of a real store, each read back by its reader: pyarrow, polars, duckdb, json."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest
from sample_store import COMPLETIONS, REWARDS, SESSIONS, TRAJECTORIES, make_store
from tracetap.builders.export_rows import CANONICAL, VERL
from tracetap.builders.export_writers import OutputExists
from tracetap.builders.exports import ExportError, export
from tracetap.builders.runner import build

# slime.utils.types.Sample: the fields `Sample.from_dict` takes, and its Status values
SLIME_FIELDS = {"group_index", "index", "prompt", "tokens", "multimodal_inputs", "response",
                "response_length", "label", "reward", "loss_mask", "weight_versions", "rollout_log_probs",
                "remove_sample", "status", "metadata", "session_id", "train_metadata"}
SLIME_STATUSES = {"pending", "completed", "truncated", "aborted", "failed"}
KEYS = ("session_id", "trace_index")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return make_store(tmp_path_factory.mktemp("exports") / "store")


def expected_traces() -> list[dict]:
    """The sample trajectories as the canonical export must hold them, session_completed joined."""
    out = []
    for sid, traces in TRAJECTORIES.items():
        failed = "error" in REWARDS[sid]["details"]
        for trace in traces:
            group = SESSIONS[sid]["metadata"].get("group_id") or trace["task_id"]
            out.append({**trace, "group_id": group, "evaluator": "session_completed",
                        "reward": None if failed else REWARDS[sid]["reward"],
                        "status": "error" if failed else trace["status"]})
    return out


def same(got: dict, want: dict) -> None:
    for column in ("session_id", "task_id", "group_id", "builder", "evaluator", "trace_index", "chain_index",
                   "segment_index", "completion_ids", "prompt_token_ids", "response_token_ids", "loss_mask",
                   "response_logprobs", "reward", "status", "finish_reason", "break_reason"):
        value = list(got[column]) if isinstance(got[column], list | tuple) else got[column]
        assert value == want[column], column


def test_parquet_round_trips_through_pyarrow_polars_and_duckdb(root, tmp_path):
    out = tmp_path / "train.parquet"
    summary = export(root, "prefix_merging", "parquet", out, evaluator="session_completed")
    assert (summary.sessions, summary.written, summary.error_traces) == (3, len(expected_traces()), 1)
    assert summary.not_trainable_traces == 0  # s3's only trace is an error now: its evaluation failed
    assert pq.read_schema(out).names == CANONICAL.names
    readers = [pq.read_table(out).to_pylist(), pl.read_parquet(out).to_dicts(),
               duckdb.sql(f"SELECT * FROM read_parquet('{out}')").to_arrow_table().to_pylist()]
    for rows in readers:
        assert len(rows) == len(expected_traces())
        ordered = sorted(rows, key=lambda r: [r[k] for k in KEYS])
        for got, want in zip(ordered, expected_traces(), strict=True):
            same(got, want)
            assert json.loads(got["metadata_json"])["evaluation"]["evaluator"] == "session_completed"


def test_jsonl_holds_the_same_rows(root, tmp_path):
    export(root, "prefix_merging", "parquet", tmp_path / "a.parquet", evaluator="session_completed")
    export(root, "prefix_merging", "jsonl", tmp_path / "a.jsonl", evaluator="session_completed")
    lines = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert lines == pq.read_table(tmp_path / "a.parquet").to_pylist()
    assert pl.read_ndjson(tmp_path / "a.jsonl").height == len(lines)
    counted = duckdb.sql(f"SELECT count(*) FROM read_json('{tmp_path / 'a.jsonl'}')").fetchall()
    assert counted == [(len(lines),)]


def test_slime_samples(root, tmp_path):
    export(root, "prefix_merging", "slime", tmp_path / "slime.jsonl", evaluator="session_completed")
    samples = [json.loads(line) for line in (tmp_path / "slime.jsonl").read_text().splitlines()]
    by_key = {(s["session_id"], s["metadata"]["tracetap"]["trace_index"]): s for s in samples}
    for want in expected_traces():
        sample = by_key[(want["session_id"], want["trace_index"])]
        assert set(sample) <= SLIME_FIELDS and sample["status"] in SLIME_STATUSES
        assert sample["tokens"] == want["prompt_token_ids"] + want["response_token_ids"]
        assert sample["response_length"] == len(want["response_token_ids"]) == len(sample["loss_mask"])
        assert sample["rollout_log_probs"] == want["response_logprobs"]
    assert [s["index"] for s in samples] == list(range(len(samples)))
    assert [s["group_index"] for s in samples] == [0, 1, 1, 2]  # g1, t1 (s2's two traces), t2
    assert [s["metadata"]["tracetap"]["rollout_id"] for s in samples] == [0, 1, 1, 2]
    assert by_key[("s1", 0)]["status"] == "completed" and by_key[("s1", 0)]["reward"] == 1.0
    assert by_key[("s2", 1)]["status"] == "truncated"  # finish_reason length
    failed = by_key[("s3", 0)]
    assert (failed["status"], failed["remove_sample"], failed["reward"]) == ("failed", True, 0.0)
    assert set(failed["loss_mask"]) == {0} and failed["metadata"]["tracetap"]["reward_missing"] is True


def test_verl_rows(root, tmp_path):
    out = tmp_path / "verl.parquet"
    export(root, "prefix_merging", "verl", out, evaluator="session_completed")
    assert pq.read_schema(out).names == VERL.names
    rows = pq.read_table(out).to_pylist()
    assert pl.read_parquet(out).height == len(rows) == len(expected_traces())
    for row, want in zip(rows, expected_traces(), strict=True):
        assert row["input_ids"] == want["prompt_token_ids"] + want["response_token_ids"]
        assert row["attention_mask"] == [1] * len(row["input_ids"])
        assert row["response_ids"] == want["response_token_ids"]
        trained = want["loss_mask"] if want["status"] == "ok" else [0] * len(want["loss_mask"])
        assert row["response_mask"] == trained
        assert row["uid"] == want["group_id"] and row["num_turns"] == len(want["completion_ids"])
        assert row["reward_score"] == (want["reward"] or 0.0)
        assert row["extra_info"]["reward_missing"] is (want["reward"] is None)
        assert row["extra_info"]["session_id"] == want["session_id"]


def test_without_evaluator_rewards_stay_null(root, tmp_path):
    export(root, "prefix_merging", "parquet", tmp_path / "x.parquet")
    rows = pq.read_table(tmp_path / "x.parquet").to_pylist()
    assert {row["reward"] for row in rows} == {None} and {row["evaluator"] for row in rows} == {None}
    assert "error" not in {row["status"] for row in rows}


def test_existing_output_is_kept_unless_forced(root, tmp_path):
    out = tmp_path / "train.parquet"
    out.write_text("precious")
    with pytest.raises(OutputExists, match="already exists"):
        export(root, "prefix_merging", "parquet", out)
    assert out.read_text() == "precious"
    export(root, "prefix_merging", "parquet", out, force=True)
    assert pq.read_table(out).num_rows == len(expected_traces())


@pytest.mark.parametrize("fmt, name", [("parquet", "t.parquet"), ("jsonl", "t.jsonl"), ("atif", "atif")])
def test_a_failed_export_leaves_nothing_behind(root, tmp_path, fmt, name):
    def explode(session_id: str) -> None:
        if session_id == "s2":
            raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        export(root, "prefix_merging", fmt, tmp_path / name, on_session=explode)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kwargs, message", [
    ({"builder": "nothing_built"}, "no trajectories of builder 'nothing_built'"),
    ({"fmt": "csv"}, "unknown format 'csv'"),
    ({"fmt": "atif", "max_tokens": 100}, "token-level format"),
    ({"max_tokens": 0}, "positive number"),
    ({"builder": "../x"}, "invalid builder"),
    ({"evaluator": "../x"}, "invalid evaluator name"),
])
def test_bad_requests(root, tmp_path, kwargs, message):
    args = {"builder": "prefix_merging", "fmt": "parquet", **kwargs}
    with pytest.raises((ExportError, ValueError), match=message.replace("(", r"\(")):
        export(root, args.pop("builder"), args.pop("fmt"), tmp_path / "out", **args)
    assert not (tmp_path / "out").exists()


def test_export_of_a_real_per_request_build(tmp_path):
    root = make_store(tmp_path / "store", trajectories=False)
    build(root, "per_request")
    export(root, "per_request", "parquet", tmp_path / "pr.parquet", evaluator="session_completed")
    rows = pq.read_table(tmp_path / "pr.parquet").to_pylist()
    ok = [row for spec in COMPLETIONS.values() for row in spec if row["status"] == "ok"]
    sampled = sorted(tuple(c["completion_token_ids"]) for c in ok)
    assert sorted(tuple(r["response_token_ids"]) for r in rows) == sampled
    assert {r["session_id"]: r["reward"] for r in rows if r["session_id"] != "s3"} == {"s1": 1.0, "s2": 0.0}
