"""Headless Chromium for tests that check pages as a browser renders them.

`ensure_chromium()` returns Debian's `/usr/bin/chromium`, installing the `chromium` package with
apt-get when it is missing and we run as root (a fresh CI machine); it skips the test with the
reason only when installing is impossible. `Browser` drives one headless Chromium over the Chrome
DevTools Protocol (the `websockets` client, which google-genai already brings): open a page, then
evaluate JavaScript in it and get the value back.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]
APT_ENV = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


def ensure_chromium() -> Path:
    """Chromium's path; installs Debian's package when missing (root only), else skips the test."""
    if CHROMIUM.exists():
        return CHROMIUM
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip(f"{CHROMIUM} is missing and cannot be installed here (needs apt-get as root)")
    output = ""
    for command in (["apt-get", "install", "-y", "chromium"], ["apt-get", "update"],
                    ["apt-get", "install", "-y", "chromium"]):
        done = subprocess.run(command, env=APT_ENV, capture_output=True, text=True, timeout=900)
        output = done.stdout[-2000:] + done.stderr[-2000:]
        if CHROMIUM.exists():
            return CHROMIUM
    pytest.skip(f"could not install chromium with apt-get: {output}")


class Browser:
    """One headless Chromium with one page, driven over the DevTools Protocol."""

    def __init__(self, profile: Path) -> None:
        self.profile = profile
        self.process: subprocess.Popen | None = None
        self.connection = ExitStack()
        self.socket = None
        self.ids = itertools.count(1)

    def __enter__(self) -> Browser:
        chromium = ensure_chromium()
        self.profile.mkdir(parents=True, exist_ok=True)
        with open(self.profile / "chromium.log", "wb") as log:  # the child keeps its own handle
            self.process = subprocess.Popen(
                [str(chromium), *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                stdout=log, stderr=log, start_new_session=True)
        try:
            self._attach()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _attach(self, timeout: float = 60.0) -> None:
        from websockets.sync.client import connect

        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = (self.profile / "chromium.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"chromium did not start its DevTools endpoint:\n{log}")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
                 if t["type"] == "page"]
        self.socket = self.connection.enter_context(connect(pages[0]["webSocketDebuggerUrl"], max_size=None))

    def send(self, method: str, **params) -> dict:
        """One DevTools command; returns its result (events in between are ignored)."""
        request_id = next(self.ids)
        self.socket.send(json.dumps({"id": request_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == request_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def open(self, path: Path, timeout: float = 30.0) -> None:
        """Load a local file and wait until the document has finished loading."""
        self.send("Page.navigate", url=path.resolve().as_uri())
        deadline = time.monotonic() + timeout
        while self.evaluate("location.href") != path.resolve().as_uri() \
                or self.evaluate("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not finish loading")
            time.sleep(0.05)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (JSON-serializable values)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        """Ask Chromium to quit (it then ends its helpers), else terminate it and its process group."""
        if self.socket is not None:
            try:
                self.send("Browser.close")
            except Exception:  # it is already gone, or it hangs: the fallback below ends it
                pass
            self.connection.close()
            self.socket = None
        if self.process is None:
            return
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:  # its helpers (zygote, renderers) share the group it leads; end any left behind
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.process = None
