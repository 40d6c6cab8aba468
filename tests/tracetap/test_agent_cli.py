"""`python -m tracetap.agent`: the demo agent as a harness command (its happy path runs in tests/rollout)."""

from __future__ import annotations

import os
import subprocess
import sys


def run_agent_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    return subprocess.run([sys.executable, "-m", "tracetap.agent", *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=60)


def test_without_a_session_id_it_says_what_is_missing():
    done = run_agent_cli("fix it", OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    assert done.returncode == 2 and "a session id is needed" in done.stderr


def test_max_turns_must_be_positive():
    done = run_agent_cli("--max-turns", "0", "fix it", OPENAI_BASE_URL="http://127.0.0.1:9/v1",
                         OPENAI_API_KEY="sk-tap-x")
    assert done.returncode == 2 and "--max-turns must be at least 1" in done.stderr
