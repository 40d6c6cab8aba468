"""`tracetap engine` as a user runs it: a real child process on a free port, stopped with SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from click.testing import CliRunner

from tracetap.cli import cli

REPO = Path(__file__).resolve().parents[2]


def test_help_names_the_options() -> None:
    result = CliRunner().invoke(cli, ["engine", "--help"])
    assert result.exit_code == 0
    for option in ("--listen", "--script", "--seed", "--served-model", "--max-model-len"):
        assert option in result.output


def test_bad_script_is_a_usage_error(tmp_path: Path) -> None:
    script = tmp_path / "bad.jsonl"
    script.write_text('{"content": "ok"}\nnot json\n')
    result = CliRunner().invoke(cli, ["engine", "--script", str(script)])
    assert result.exit_code == 2 and "bad.jsonl:2" in result.output


def test_bad_listen_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["engine", "--listen", "nowhere"])
    assert result.exit_code == 2 and "HOST:PORT" in result.output


def test_serves_until_sigterm(tracetap_home: Path, script_file: Path) -> None:
    command = [sys.executable, "-c", "from tracetap.cli import main; main()", "engine",
               "--listen", "127.0.0.1:0", "--script", str(script_file), "--served-model", "cli-tiny"]
    child = subprocess.Popen(command, cwd=REPO, env={**os.environ, "TRACETAP_HOME": str(tracetap_home)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = child.stdout.readline()
        url = re.search(r"at (http://127\.0\.0\.1:\d+) ", banner).group(1)
        assert httpx.get(f"{url}/health").status_code == 200
        body = {"messages": [{"role": "user", "content": "hi"}], "return_token_ids": True}
        session = {"x-tracetap-session": "cli"}
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers=session).json()
        assert reply["model"] == "cli-tiny" and reply["choices"][0]["token_ids"][-1] == 151645
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=30)
    assert child.returncode == 0
