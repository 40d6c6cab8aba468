"""Each real CLI runs one-shot through the gateway: the scripted model asks for one shell command, then ends.

Checked from the outside: the CLI exits 0, the command's file is in its workspace, and the store holds the
session's completions under the CLI's API with token ids and aligned logprobs, the turn after the tool call
extending the tool call's prompt and completion token for token.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracetap import harnesses, store
from tracetap.harnesses import HARNESSES, HarnessRun
from tracetap.launch import GatewayProcess

PROOF = "tracetap-harness-ok"
COMMAND = f"echo {PROOF} > proof.txt"
PROMPT = f"Run this shell command in the current directory: {COMMAND}"
FINAL = "Done: proof.txt is written."
TIMEOUT = 180.0
COLUMNS = ("seq, api, status, error, finish_reason, tool_calls, prompt_token_ids, completion_token_ids, "
           "logprobs")


def explain(run: HarnessRun, gateway: GatewayProcess) -> str:
    return (f"{run.harness}: exit {run.returncode}, timed out {run.timed_out}, {run.seconds:.0f}s\n"
            f"--- stdout\n{run.stdout[-3000:]}\n--- stderr\n{run.stderr[-3000:]}\n"
            f"--- gateway log\n{gateway.log()[-3000:]}")


def session_rows(store_dir: Path, session_id: str) -> list[dict]:
    cursor = store.connect(store_dir).execute(
        f"SELECT {COLUMNS} FROM completions WHERE session_id = ? ORDER BY seq", [session_id])
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


@pytest.mark.parametrize("name", list(HARNESSES))
def test_cli_runs_one_shot_through_the_gateway(name: str, installed: dict[str, Path], gateways,
                                               tmp_path: Path) -> None:
    harness = HARNESSES[name]
    session_id = f"sk-tap-harness-{name}"
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    script = harnesses.write_script(tmp_path / "script.jsonl", harness, [COMMAND], FINAL)
    gateway = gateways.start(tmp_path / "store", script)
    run = harnesses.run_harness(harness, installed[name], gateway.url, session_id, PROMPT, workspace,
                                tmp_path / "home", timeout=TIMEOUT)
    rows = session_rows(tmp_path / "store", session_id)  # acknowledged calls are on disk already
    gateways.release(gateway)
    assert run.returncode == 0, explain(run, gateway)
    assert (workspace / "proof.txt").read_text().strip() == PROOF, explain(run, gateway)
    assert {(row["api"], row["status"], row["error"]) for row in rows} == {(harness.api, "ok", None)}
    for row in rows:
        assert row["prompt_token_ids"] and row["completion_token_ids"]
        assert len(row["logprobs"]) == len(row["completion_token_ids"])
    (call,) = [row for row in rows if row["finish_reason"] == "tool_calls"]
    assert [c["name"] for c in call["tool_calls"]] == [harness.shell_tool]
    assert json.loads(call["tool_calls"][0]["arguments"]) == harness.shell_arguments(COMMAND)
    turn = call["prompt_token_ids"] + call["completion_token_ids"]
    continued = [row for row in rows if row["prompt_token_ids"][:len(turn)] == turn]
    assert continued, "no later prompt extends the tool call's prompt + completion token for token"
    assert continued[0]["finish_reason"] == "stop"


def test_demo_runs_a_real_harness(installed: dict[str, Path], npm_dir: Path, tmp_path: Path) -> None:
    """`tracetap demo --harness pi`: the CLI fixes the project in each session; the summary is the store's."""
    out = tmp_path / "demo"
    env = {**os.environ, "TRACETAP_NPM_DIR": str(npm_dir)}
    done = subprocess.run([sys.executable, "-m", "tracetap.cli", "demo", "--harness", "pi", "--sessions", "2",
                           "--out", str(out), "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])

    con = store.connect(out / "store")
    calls = con.execute("SELECT count(*), sum(completion_tokens), sum(prompt_tokens) FROM completions").fetchone()
    assert (summary["calls"], summary["sampled_tokens"], summary["prompt_tokens"]) == calls
    assert summary["calls"] == summary["ok_calls"] == summary["calls_with_aligned_logprobs"]
    tools = con.execute("SELECT list(t.name ORDER BY seq) FROM (SELECT seq, unnest(tool_calls) AS t "
                        "FROM completions WHERE session_id = 'sk-tap-demo-1')").fetchone()[0]
    assert tools == ["bash"] * 3  # test, fix, test: through pi's own shell tool
    assert dict(con.execute("SELECT session_id, reward FROM rewards").fetchall()) == {
        "sk-tap-demo-1": 1.0, "sk-tap-demo-2": 1.0}
    assert summary["sessions"] == summary["solved_sessions"] == 2
    assert "return a + b" in (out / "workspaces" / "sk-tap-demo-1" / "calc.py").read_text()
