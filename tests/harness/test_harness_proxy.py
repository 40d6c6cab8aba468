"""Each real CLI, run through `tracetap run` with no base-URL setting at all, inside a network namespace that
has only loopback: the proxy (a gateway in proxy mode that `tracetap run` starts in the same namespace) is
the only way out, so a connection that ignores it fails instead of reaching the internet.

`strace` logs every connect() the CLI's processes make; connections to anything but loopback (a direct
connection, or the DNS lookup before one) bypassed the proxy and are reported per CLI, beside the hosts the
gateway refused. The checks: the CLI did the work, every call it made is in the run's session with token ids,
and the refused hosts `tracetap run` printed are the session row's.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import cli_sessions
import live
import pytest
from tracetap.capture.proxy_client import PROXY_VARIABLES
from tracetap.rollout.harnesses import CLI_HARNESSES
from tracetap.rollout.harnesses.base import HarnessContext, gateway_env
from tracetap.rollout.harnesses.script import GATEWAY_ARGS, write_script
from tracetap.rollout.runtimes.base import SessionLayout
from tracetap.store import connect

CONNECT = re.compile(r'connect\(\d+, \{sa_family=AF_INET6?, sin6?_port=htons\((\d+)\), '
                     r'(?:sin_addr=inet_addr\("([^"]+)"\)|.*?inet_pton\(AF_INET6, "([^"]+)")')
LOOPBACK = re.compile(r"^(127\.|::1$|::ffff:127\.)")
TIMEOUT = 300


def layout(root: Path) -> SessionLayout:
    folders = SessionLayout(str(root), str(root / "home"), str(root / "workspace"), str(root / "artifacts"),
                            str(root / "logs"), str(root / "logs" / "agent"))
    for folder in (folders.home, folders.workspace, folders.artifacts, folders.agent_logs, root / "tmp"):
        Path(folder).mkdir(parents=True, exist_ok=True)
    return folders


def bypassed(trace: Path) -> list[str]:
    """`address:port` of every connect() to something other than loopback (port 53: a DNS lookup)."""
    found = set()
    for match in CONNECT.finditer(trace.read_text(errors="replace") if trace.exists() else ""):
        address = match.group(2) or match.group(3)
        if not LOOPBACK.match(address):
            found.add(f"{address}:{match.group(1)}")
    return sorted(found)


def run_through_proxy(name: str, root: Path) -> tuple[subprocess.CompletedProcess, str, SessionLayout]:
    """The CLI's one-shot run under `unshare -n` + `tracetap run` + `strace`; (outcome, session id, layout)."""
    preset, session = CLI_HARNESSES[name], f"proxied-{name.replace('_', '-')}"
    folders = layout(root / "session")
    ctx = HarnessContext(session_id=session, session_key=session, task_id="proxy", instruction=cli_sessions.PROMPT,
                         gateway_url="http://127.0.0.1:9", layout=folders, via_proxy=True)
    for path, text in preset.files(ctx).items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    script = write_script(root / "script.jsonl", preset, [cli_sessions.COMMAND], cli_sessions.FINAL)
    (step,) = preset.run_steps(ctx)
    traced = ["strace", "-f", "-qq", "-e", "trace=connect", "-e", "signal=none", "-o", str(root / "connects.txt"),
              "bash", "-c", step.command]
    run = [sys.executable, "-m", "tracetap.cli", "run", "--store", str(root / "store"), "--script", str(script),
           *GATEWAY_ARGS, "--session", session, "--", *traced]
    env = {**os.environ, **gateway_env(ctx), **preset.env(ctx)}
    env = {key: value for key, value in env.items() if key not in PROXY_VARIABLES}  # `tracetap run` sets them
    return _in_loopback_namespace(run, env, folders.workspace), session, folders


def _in_loopback_namespace(argv: list[str], env: dict, cwd: str) -> subprocess.CompletedProcess:
    """argv in a new network namespace with only `lo` up; its whole process group killed on timeout."""
    inner = f"ip link set lo up && exec {shlex.join(argv)}"
    process = subprocess.Popen(["unshare", "--net", "bash", "-c", inner], env=env, cwd=cwd, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.mark.parametrize("name", list(CLI_HARNESSES))
def test_cli_is_recorded_through_tracetap_run_with_no_base_url(name, installed, tmp_path):
    done, session, folders = run_through_proxy(name, tmp_path)
    report = {"cli": name, "bypassed_proxy": bypassed(tmp_path / "connects.txt"),
              "refused": re.findall(r"refused (\S+) \((\d+)x\)", done.stderr)}
    print(json.dumps(report))  # shown with -rA; the closing note quotes these
    explain = f"{report}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    assert done.returncode == 0, explain
    assert (Path(folders.workspace) / "proof.txt").read_text().strip() == cli_sessions.PROOF, explain
    rows = live.store_rows(tmp_path / "store")
    assert rows and {row["session_id"] for row in rows} == {session}, explain
    assert all(row["status"] == "ok" and row["prompt_token_ids"] and row["completion_token_ids"] for row in rows)
    assert f"session {session}: {len(rows)} calls recorded" in done.stderr
    with connect(tmp_path / "store") as con:
        (refused,) = con.execute("SELECT refused_hosts_json FROM sessions WHERE session_id = ?", [session]).fetchone()
    assert json.loads(refused or "{}") == {host: int(count) for host, count in report["refused"]}
