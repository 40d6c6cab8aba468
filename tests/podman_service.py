"""Rootless podman for the `podman` tier: a running service is used, else `scripts/podman.sh start` starts one.

The script installs podman and creates the unprivileged user when missing (as root). Whatever this module
starts it stops at the end of the run (by the script's pid file); a service that was already answering is
left alone.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from docker_daemon import _answers
from tracetap.rollout.runtimes.podman import podman_url

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "podman.sh"
VARIABLE = "TRACETAP_PODMAN_HOST"


def podman_service() -> Iterator[str]:
    """Yield a TRACETAP_PODMAN_HOST that answers (set in os.environ for the run)."""
    url = podman_url()
    started = not _answers(url)
    if started:
        run = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"scripts/podman.sh start failed:\n{run.stderr[-3000:]}"
        url = run.stdout.strip().splitlines()[-1].split("=", 1)[1]
    saved = os.environ.get(VARIABLE)
    os.environ[VARIABLE] = url
    try:
        yield url
    finally:
        if saved is None:
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = saved
        if started:
            subprocess.run([str(SCRIPT), "stop"], capture_output=True, timeout=120)
