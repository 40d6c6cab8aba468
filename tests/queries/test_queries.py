"""Every named query runs on a small real store and returns the rows its data implies."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
from sample_store import COMPLETIONS, SESSIONS, TRAJECTORIES, make_store
from tracetap.queries import QueryError, bind, list_queries, load_query, parse_query, run_query
from tracetap.store import connect


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    return connect(make_store(tmp_path_factory.mktemp("queries") / "store"))


def rows(con, name: str, **params) -> list[dict]:
    result = run_query(con, name, {key: str(value) for key, value in params.items()})
    columns = [column[0] for column in result.description]
    return [dict(zip(columns, row, strict=True)) for row in result.fetchall()]


def ok_rows(sid: str | None = None) -> list[dict]:
    return [row for s, spec in COMPLETIONS.items() if sid in (None, s)
            for row in spec if row["status"] == "ok"]


def test_at_least_twelve_queries_each_with_a_header_and_declared_params():
    queries = list_queries()
    assert len(queries) >= 12
    for query in queries:
        assert len(query.description) > 30, query.name
        body = "\n".join(line.split("--")[0] for line in query.sql.splitlines())
        assert set(re.findall(r"\$(\w+)", body)) == {p.name for p in query.params}, query.name


@pytest.mark.parametrize("name", [q.name for q in list_queries()])
def test_every_query_runs_on_an_empty_store(tmp_path, name):
    from tracetap.store import StoreWriter

    StoreWriter(tmp_path / "empty").close()
    assert rows(connect(tmp_path / "empty"), name) == []


def test_tool_calls_by_tool(con):
    counts = Counter(call["name"] for row in ok_rows() for call in row["tool_calls"])
    got = rows(con, "tool_calls_by_tool")
    assert [(r["tool"], r["calls"]) for r in got] == counts.most_common()
    assert [r["sessions"] for r in got] == [2, 2]
    assert got[0]["share"] == round(counts["bash"] / sum(counts.values()), 4)
    assert [r["tool"] for r in rows(con, "tool_calls_by_tool", limit=1)] == ["bash"]
    assert {r["tool"]: r["calls"] for r in rows(con, "tool_calls_by_tool", session_id="s3")} == {
        "bash": 1, "read_file": 1}


def test_turns_per_session(con):
    got = rows(con, "turns_per_session")
    assert [r["session_id"] for r in got] == ["s1", "s2", "s3"]
    for r in got:
        spec = COMPLETIONS[r["session_id"]]
        assert r["calls"] == len(spec) and r["ok_turns"] == len(ok_rows(r["session_id"]))
        assert r["failed_calls"] == len(spec) - r["ok_turns"]
        assert r["tool_call_turns"] == sum(1 for row in ok_rows(r["session_id"]) if row["tool_calls"])
        assert (r["task_id"], r["harness"]) == (SESSIONS[r["session_id"]]["task_id"],
                                                 SESSIONS[r["session_id"]]["harness"])


def test_context_growth(con):
    prompts = [row["prompt_tokens"] for row in ok_rows("s1")]
    got = rows(con, "context_growth", session_id="s1")
    assert [r["prompt_tokens"] for r in got] == prompts
    assert [r["growth"] for r in got] == [None] + [b - a for a, b in zip(prompts, prompts[1:], strict=False)]
    assert [r["turn"] for r in got] == [1, 2, 3, 4]
    big = rows(con, "context_growth", min_prompt_tokens=20)
    assert [(r["session_id"], r["seq"], r["growth"]) for r in big] == [("s1", 2, 6), ("s1", 3, 6)]


def test_finish_reasons(con):
    counts = Counter(row["finish_reason"] for row in ok_rows())
    got = rows(con, "finish_reasons")
    assert {r["finish_reason"]: r["calls"] for r in got} == counts
    assert got[0]["finish_reason"] == "tool_calls"
    assert sum(r["share"] for r in got) == pytest.approx(1.0, abs=1e-3)


def test_latency_percentiles(con):
    upstream = np.array([row["upstream_ms"] for row in ok_rows()])
    gateway = np.array([row["gateway_ms"] for row in ok_rows()])
    (got,) = rows(con, "latency_percentiles")
    assert got["calls"] == len(upstream)
    for column, values, q in [("upstream_p50", upstream, 50), ("upstream_p90", upstream, 90),
                              ("gateway_p99", gateway, 99), ("overhead_p50", gateway - upstream, 50)]:
        assert got[column] == pytest.approx(np.percentile(values, q), abs=0.01), column
    everything = sum(len(spec) for spec in COMPLETIONS.values())
    assert rows(con, "latency_percentiles", status="null")[0]["calls"] == everything


def test_error_rates(con):
    got = {(r["status"], r["http_status"]): r for r in rows(con, "error_rates")}
    total = sum(len(spec) for spec in COMPLETIONS.values())
    assert got[("ok", 200)]["calls"] == len(ok_rows())
    assert got[("ok", 200)]["rate"] == round(len(ok_rows()) / total, 4)
    assert got[("upstream_error", 400)]["example_error"].startswith("This model's maximum context length")
    assert got[("timeout", 504)]["sessions"] == 1


def test_repeated_tool_calls(con):
    (run,) = rows(con, "repeated_tool_calls")
    assert (run["session_id"], run["repeats"], run["first_seq"], run["last_seq"]) == ("s1", 3, 0, 2)
    assert run["tool_calls"] == 'bash({"cmd": "ls"})'
    assert rows(con, "repeated_tool_calls", min_repeats=4) == []
    assert len(rows(con, "repeated_tool_calls", min_repeats=1)) == 3  # s1's run, s2's and s3's single turns


def test_token_coverage(con):
    (got,) = rows(con, "token_coverage")
    aligned = sum(1 for row in ok_rows() if row["logprobs"] is not None)
    assert (got["calls"], got["with_prompt_ids"], got["with_aligned_logprobs"]) == (len(ok_rows()),
                                                                                 len(ok_rows()), aligned)
    assert got["rl_coverage"] == round(aligned / len(ok_rows()), 4)
    assert got["usage_mismatches"] == 0


def test_chains_per_session(con):
    got = {r["session_id"]: r for r in rows(con, "chains_per_session")}
    s2 = got["s2"]
    assert (s2["traces"], s2["chains"], s2["segments"], s2["breaks"]) == (2, 1, 2, 1)
    assert got["s2"]["break_reasons"] == "canonical_prefix_break"
    assert got["s1"]["completions"] == len(COMPLETIONS["s1"]) and got["s1"]["breaks"] == 0
    assert got["s2"]["drift_tokens"] == sum(t["trace_index"] for t in TRAJECTORIES["s2"])
    assert got["s3"]["problem_traces"] == 1
    assert rows(con, "chains_per_session", builder="per_request") == []


def test_reward_by_task_and_harness(con):
    got = {(r["task_id"], r["harness"]): r for r in rows(con, "reward_by_task_harness")}
    assert (got[("t1", "h1")]["mean_reward"], got[("t1", "h1")]["successes"]) == (1.0, 1)
    assert (got[("t1", "h2")]["mean_reward"], got[("t1", "h2")]["successes"]) == (0.0, 0)
    assert (got[("t2", "h1")]["mean_reward"], got[("t2", "h1")]["failed_evaluations"]) == (None, 1)
    lenient = {(r["task_id"], r["harness"]): r
               for r in rows(con, "reward_by_task_harness", success_threshold=0)}
    assert lenient[("t1", "h2")]["successes"] == 1
    assert rows(con, "reward_by_task_harness", evaluator="test_on_output") == []


def test_length_limited_sessions(con):
    (got,) = rows(con, "length_limited_sessions")
    biggest = max(row["prompt_tokens"] for row in ok_rows("s2"))
    assert got == {"session_id": "s2", "length_stops": 1, "context_overflows": 1,
                   "max_prompt_tokens": biggest, "ended_at_limit": True}


def test_merge_savings(con):
    per_request = {sid: sum(len(r["prompt_token_ids"]) + len(r["completion_token_ids"]) for r in ok_rows(sid))
                   for sid in COMPLETIONS}
    merged = {sid: sum(len(t["prompt_token_ids"]) + len(t["response_token_ids"]) for t in traces)
              for sid, traces in TRAJECTORIES.items()}
    got = {r["session_id"]: r for r in rows(con, "merge_savings")}
    assert list(got) == ["s1", "s2", "s3", "TOTAL"]
    for sid in COMPLETIONS:
        assert (got[sid]["per_request_tokens"], got[sid]["merged_tokens"]) == (per_request[sid], merged[sid])
    total_saving = 1 - sum(merged.values()) / sum(per_request.values())
    assert got["TOTAL"]["saving"] == round(total_saving, 4) and total_saving > 0.4


def test_parameters_are_bound_not_pasted(con):
    assert rows(con, "context_growth", session_id="s1' OR '1'='1") == []


@pytest.mark.parametrize("given, message", [
    ({"nope": "1"}, "has no parameter nope"),
    ({"limit": "ten"}, "must be int"),
])
def test_bad_parameters(given, message):
    with pytest.raises(QueryError, match=message):
        bind(load_query("tool_calls_by_tool"), given)


@pytest.mark.parametrize("name", ["nope", "../secrets", "Tool_Calls"])
def test_unknown_query(name):
    with pytest.raises(QueryError, match="unknown query"):
        load_query(name)


@pytest.mark.parametrize("text, message", [
    ("SELECT 1;", "missing header"),
    ("-- What it does.\n-- @param x (int default 1): bad\nSELECT $x;", "malformed parameter"),
])
def test_malformed_query_files(text, message):
    with pytest.raises(QueryError, match=message):
        parse_query("q", text)


def test_null_and_typed_defaults():
    query = parse_query("q", "-- Doc line.\n-- @param a (str, default null): a\n"
                             "-- @param b (float, default 0.5): b\nSELECT $a, $b;")
    assert bind(query, {}) == {"a": None, "b": 0.5}
    assert bind(query, {"a": "x", "b": "2"}) == {"a": "x", "b": 2.0}
