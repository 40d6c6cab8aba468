"""Each real CLI runs as a rollout session: the scripted model asks for one shell command, then ends.

Checked from the outside: the session ends COMPLETED, the command's file is in the session's workspace, the
CLI's output is in logs/agent, and the store holds every call of the run in the rollout session under the
CLI's API with token ids and aligned logprobs, the turn after the tool call extending the tool call's prompt
and completion token for token.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import cli_sessions
import pytest
from tracetap.builders import build
from tracetap.rollout.harnesses import CLI_HARNESSES

from tracetap import store
from tracetap.common import decode


@pytest.mark.parametrize("name", list(CLI_HARNESSES))
def test_cli_runs_as_a_rollout_session(name, installed, tmp_path):
    cli_sessions.check_session(cli_sessions.run_cli_session(name, tmp_path))


@pytest.mark.parametrize("name", list(CLI_HARNESSES))
def test_cli_session_in_gateway_mode_merges_with_zero_drift(name, installed, tmp_path):
    """`--tokenize gateway` with an engine sampling every reply in pieces: the turn after the tool call
    continues it verbatim, and the session's traces carry no drift."""
    run = cli_sessions.run_cli_session(name, tmp_path, tokenize="gateway")
    cli_sessions.check_session(run)
    (call,) = [row for row in run.rows if row["finish_reason"] == "tool_calls"]
    metas = [json.loads(row["metadata_json"]) for row in run.rows]
    assert {meta["tokenization"] for meta in metas} == {"gateway"}
    assert call["completion_id"] in {meta["continues"] for meta in metas}, run.explain()
    sid = run.result.session_id
    stats = build(run.store, "prefix_merging", [sid], decode=decode)
    assert stats.session_stats[sid]["drift_tokens"] == 0, stats.session_stats[sid]


def test_demo_runs_a_real_harness(installed, tmp_path):
    """`tracetap demo --harness pi`: the task goes through the rollout server; pi fixes the project in each
    session; the summary is the store's."""
    out = tmp_path / "demo"
    env = {**os.environ, "TRACETAP_NPM_DIR": str(cli_sessions.NPM_DIR)}
    done = subprocess.run([sys.executable, "-m", "tracetap.cli", "demo", "--harness", "pi", "--sessions", "2",
                           "--out", str(out), "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])

    con = store.connect(out / "store")
    calls = con.execute("SELECT count(*), sum(completion_tokens), sum(prompt_tokens) FROM completions").fetchone()
    assert (summary["calls"], summary["sampled_tokens"], summary["prompt_tokens"]) == calls
    assert summary["calls"] == summary["ok_calls"] == summary["calls_with_aligned_logprobs"]
    [callback] = json.loads((out / "callbacks.json").read_text())
    sids = callback["session_ids"]  # in sample order
    tools = con.execute("SELECT list(t.name ORDER BY seq) FROM (SELECT seq, unnest(tool_calls) AS t "
                        "FROM completions WHERE session_id = ?)", [sids[0]]).fetchone()[0]
    assert tools == ["bash"] * 3  # test, fix, test: through pi's own shell tool
    # The second (last) sample's prepare step makes a test stricter than the fix can satisfy.
    assert dict(con.execute("SELECT session_id, reward FROM rewards").fetchall()) == {sids[0]: 1.0, sids[1]: 0.5}
    assert dict(con.execute("SELECT session_id, harness FROM sessions").fetchall()) == {sid: "pi" for sid in sids}
    assert summary["sessions"] == 2 and summary["solved_sessions"] == 1
    for sid in sids:
        assert "return a + b" in (out / "sessions" / sid / "workspace" / "calc.py").read_text()
