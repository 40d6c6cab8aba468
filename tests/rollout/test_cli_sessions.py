"""pi and claude_code, the real CLIs from npm, as rollout sessions through the local runtime (default tier).

All six run the same way in the harness tier (tests/harness). Each session's calls are bound to its
rollout session id, its command really ran in the session's workspace, and its output is in logs/agent.
"""

from __future__ import annotations

import cli_sessions
import pytest

DEFAULT_TIER = ["pi", "claude_code"]


@pytest.fixture(scope="module")
def installed():
    with cli_sessions.installed(DEFAULT_TIER) as binaries:
        yield binaries


@pytest.mark.parametrize("name", DEFAULT_TIER)
def test_cli_runs_as_a_rollout_session(name, installed, tmp_path):
    cli_sessions.check_session(cli_sessions.run_cli_session(name, tmp_path))
