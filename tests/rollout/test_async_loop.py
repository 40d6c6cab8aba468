"""examples/async_loop.py end to end: a rollout server on the embedded engine, two rounds fenced by a
pause and a resume under the next policy version, rewarded samples from each version."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import live
from conftest import DEMO
from tracetap.rollout.serve import ServeConfig, rollout_server

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "async_loop.py"


def test_the_example_loop_produces_rewarded_samples_for_two_policy_versions(tmp_path):
    with rollout_server(ServeConfig(tmp_path / "store", script=DEMO / "script.jsonl")) as server:
        done = subprocess.run([sys.executable, str(EXAMPLE), "--server", server.url, "--rounds", "2"],
                              capture_output=True, text=True, timeout=600)
        status = httpx.get(f"{server.url}/admin/status", timeout=30, headers=live.control_headers()).json()
    assert done.returncode == 0, done.stderr[-3000:]
    rounds = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["policy_version"], r["samples"], r["versions"]) for r in rounds] == [("1", 2, ["1"]), ("2", 2, ["2"])]
    assert all(reward == 1.0 for r in rounds for reward in r["rewards"])
    [gateway] = status["gateways"].values()
    assert (gateway["paused"], gateway["policy_version"]) == (False, "3")
