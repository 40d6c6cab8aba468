"""The export token budget: clip responses to a causal prefix, never trim prompts, drop what cannot fit."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from sample_store import TRAJECTORIES, make_store
from tracetap.builders.export_budget import apply_budget
from tracetap.builders.exports import export


def trace(prompt: int, response: int, logprobs: bool = True) -> dict:
    return {"prompt_token_ids": list(range(prompt)), "response_token_ids": list(range(100, 100 + response)),
            "loss_mask": [i % 2 for i in range(response)],
            "response_logprobs": [-float(i) for i in range(response)] if logprobs else None,
            "status": "ok", "metadata_json": json.dumps({"trace": {"turns": 2}})}


@pytest.mark.parametrize("prompt, response, budget", [(5, 5, None), (5, 5, 10), (5, 5, 100), (0, 3, 3)])
def test_traces_that_fit_are_untouched(prompt, response, budget):
    original = trace(prompt, response)
    assert apply_budget(original, budget) is original


@pytest.mark.parametrize("prompt, budget", [(10, 10), (11, 10), (10, 1)])
def test_a_prompt_that_fills_the_budget_drops_the_trace(prompt, budget):
    assert apply_budget(trace(prompt, 3), budget) is None


@pytest.mark.parametrize("prompt, response, budget", [(5, 10, 6), (5, 10, 12), (1, 50, 49)])
def test_the_response_is_clipped_to_its_causal_prefix(prompt, response, budget):
    original = trace(prompt, response)
    clipped = apply_budget(original, budget)
    kept = budget - prompt
    assert clipped["prompt_token_ids"] == original["prompt_token_ids"]  # never trimmed
    assert clipped["response_token_ids"] == original["response_token_ids"][:kept]
    assert clipped["loss_mask"] == original["loss_mask"][:kept]
    assert clipped["response_logprobs"] == original["response_logprobs"][:kept]
    assert len(clipped["prompt_token_ids"]) + len(clipped["response_token_ids"]) == budget
    metadata = json.loads(clipped["metadata_json"])
    assert metadata["token_clipping"] == {"max_tokens": budget, "response_length": response, "kept": kept}
    assert metadata["trace"] == {"turns": 2}
    assert len(original["response_token_ids"]) == response  # the input is not modified


def test_null_logprobs_stay_null_when_clipped():
    assert apply_budget(trace(2, 8, logprobs=False), 5)["response_logprobs"] is None


def test_export_applies_the_budget_and_counts_drops(tmp_path):
    root = make_store(tmp_path / "store")
    traces = [t for rows in TRAJECTORIES.values() for t in rows]
    budget = 14
    fits = [t for t in traces if len(t["prompt_token_ids"]) + len(t["response_token_ids"]) <= budget]
    dropped = [t for t in traces if len(t["prompt_token_ids"]) >= budget]
    summary = export(root, "prefix_merging", "parquet", tmp_path / "b.parquet", max_tokens=budget)
    assert summary.not_trainable_traces == sum(t["status"] == "not_trainable" for t in fits)
    assert summary.dropped_over_budget == len(dropped) == 1
    assert summary.clipped == len(traces) - len(fits) - len(dropped) == 1
    rows = pq.read_table(tmp_path / "b.parquet").to_pylist()
    assert len(rows) == summary.written == len(traces) - len(dropped)
    assert all(len(r["prompt_token_ids"]) + len(r["response_token_ids"]) <= budget for r in rows)
    clipped = [r for r in rows if "token_clipping" in json.loads(r["metadata_json"])]
    assert [r["session_id"] for r in clipped] == ["s1"]

    export(root, "prefix_merging", "slime", tmp_path / "b.jsonl", max_tokens=budget)
    samples = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [s["status"] for s in samples if s["session_id"] == "s1"] == ["truncated"]
    assert all(len(s["tokens"]) <= budget for s in samples)
