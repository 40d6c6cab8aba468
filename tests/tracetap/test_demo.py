"""`tracetap demo` end to end: its summary must agree with the store it wrote."""

import json
import subprocess
import sys

from tracetap import store


def test_demo_summary_matches_store(tmp_path):
    out = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "tracetap.cli", "demo", "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])

    con = store.connect(out / "store")
    calls = con.execute("SELECT count(*), sum(completion_tokens), sum(prompt_tokens) FROM completions").fetchone()
    assert (summary["calls"], summary["sampled_tokens"], summary["prompt_tokens"]) == calls
    assert summary["sessions"] == len(list((out / "store" / "sessions").iterdir())) == 3
    merged = con.execute(
        "SELECT loss_mask, response_token_ids, prompt_token_ids FROM trajectories WHERE builder = 'prefix_merging'"
    ).fetchall()
    assert summary["merged_trainable_tokens"] == sum(sum(mask) for mask, _, _ in merged) == calls[1]
    assert summary["merged_tokens"] == sum(len(r) + len(p) for _, r, p in merged)
    # The task went through the rollout server: its result is in the store, one row per sample.
    task = json.loads((out / "store" / "rollouts" / "task_id=fix-calc" / "task.json").read_text())["result"]
    assert task["status"] == "completed" and len(task["session_ids"]) == 3
    rewards = dict(con.execute("SELECT session_id, reward FROM rewards").fetchall())
    # Every sample fixes add(); the last one's project also has a test the fix cannot satisfy.
    assert rewards == {r["session_id"]: r["reward"] for r in task["results"]}
    assert [rewards[sid] for sid in task["session_ids"]] == [1.0, 1.0, 0.5]
    assert summary["solved_sessions"] == 2
    harness = con.execute("SELECT DISTINCT task_id, harness FROM sessions").fetchall()
    assert harness == [("fix-calc", "builtin")]
    joined = con.execute("SELECT DISTINCT session_id, reward FROM trajectories WHERE builder = 'prefix_merging'")
    assert dict(joined.fetchall()) == rewards
    assert (out / "dataset.parquet").exists() and (out / "report.html").exists()
    assert task["session_ids"][0] in (out / "report.html").read_text()
