"""Start and stop a gateway process: shared by the demo, the benchmark and the tests."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from tracetap.capture import READY_MARKER
from tracetap.control import control_token
from tracetap.store import StorePath

_READY = re.compile(re.escape(READY_MARKER) + r"http://[^\s]+:(\d+)\n")
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # ignores *_PROXY in our own env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ChildProcess:
    """A child started with its output in `log_path`; stopped by its pid (SIGKILL if it will not go)."""

    process: subprocess.Popen
    log_path: Path

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for(self, line: re.Pattern[str], timeout: float, what: str) -> re.Match[str]:
        """The first match of `line` in the output, once the child prints it; a child that exits or is
        still silent after `timeout` seconds is stopped and a RuntimeError shows the end of its output."""
        deadline = time.monotonic() + timeout
        while not (found := line.search(self.log())):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{what} did not start:\n{self.log()[-3000:]}")
            time.sleep(0.1)
        return found

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class GatewayProcess(ChildProcess):
    """A `tracetap gateway` child process; `url` is its root (OpenAI clients add /v1)."""

    store: StorePath
    port: int
    process: subprocess.Popen
    log_path: Path
    extra_args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        """SIGKILL by pid: what a crash looks like to the store."""
        self.stop(signal.SIGKILL)

    def close_session(self, session_id: str) -> dict:
        return close_session(self.url, session_id)


def close_session(gateway_url: str, session_id: str) -> dict:
    """Tell a gateway a session is over: it compacts the session's files and marks it closed.
    Returns its answer: `{session_id, status, calls, refused_hosts}`."""
    return _post(f"{gateway_url}/sessions/{session_id}/close", None)


def register_session(gateway_url: str, session_id: str, metadata: dict | None = None, **fields: object) -> dict:
    """Name a session before its first call (`fields`: task_id, harness, session_key, outcome_token). The
    answer holds the session key its harness calls with and the outcome token, unless it was registered
    before (DESIGN §9)."""
    return _post(f"{gateway_url}/sessions", {"session_id": session_id, "metadata": metadata or {}, **fields})


def _post(url: str, body: dict | None) -> dict:
    """POST to a gateway's own endpoints with the control token, never through a proxy; raises
    urllib.error.HTTPError."""
    data = b"" if body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json", "authorization": f"Bearer {control_token()}"}
    request = urllib.request.Request(url, method="POST", data=data, headers=headers)
    with _DIRECT.open(request, timeout=60) as reply:
        return json.loads(reply.read())



def start_gateway(store: StorePath, *args: str, port: int | None = None, timeout: float = 120.0,
                  env: dict | None = None, log_dir: Path | None = None) -> GatewayProcess:
    """Run `tracetap gateway --store STORE ARGS...` and wait until it says it is ready. With no `port`
    the gateway binds a free one itself and its ready line says which: a port picked here and bound
    seconds later could be taken meanwhile. Its output goes to `log_dir` (default: beside a local
    store; an object store needs one)."""
    if isinstance(store, Path):
        store.mkdir(parents=True, exist_ok=True)
        log_dir = log_dir or store.parent
    if log_dir is None:
        raise ValueError(f"a gateway over {store} needs a log_dir for its output")
    handle, name = tempfile.mkstemp(prefix="gateway-", suffix=".log", dir=log_dir)
    cmd = [sys.executable, "-m", "tracetap.cli", "gateway", "--store", str(store),
           "--listen", f"127.0.0.1:{port or 0}", *args]
    with open(handle, "wb") as log:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    gateway = GatewayProcess(store, port or 0, process, Path(name), list(args))
    gateway.port = int(gateway.wait_for(_READY, timeout, "gateway").group(1))
    return gateway
