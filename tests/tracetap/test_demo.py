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
    rewards = dict(con.execute("SELECT session_id, reward FROM rewards").fetchall())
    # Two sessions fix the bug; the last one runs out of turns with add() still broken.
    assert rewards == {"sk-tap-demo-1": 1.0, "sk-tap-demo-2": 1.0, "sk-tap-demo-3": 0.5}
    assert summary["solved_sessions"] == 2
    assert (out / "dataset.parquet").exists() and (out / "report.html").exists()
    assert "sk-tap-demo-1" in (out / "report.html").read_text()
