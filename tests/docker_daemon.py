"""The shared Docker engine for the `docker` tier: a running daemon is used, else `scripts/dockerd.sh` starts one.

Whatever this module starts it stops at the end of the run (by the script's pid file); a daemon that was
already answering is left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "dockerd.sh"
DEFAULT_SOCKET = "unix:///run/tracetap-docker/docker.sock"


def _answers(host: str) -> bool:
    probe = subprocess.run(["curl", "-sf", "--max-time", "5", "--unix-socket", host.removeprefix("unix://"),
                            "http://localhost/_ping"], capture_output=True)
    return probe.returncode == 0


def docker_daemon() -> Iterator[str]:
    """Yield a DOCKER_HOST that answers (set in os.environ for the run)."""
    host = os.environ.get("DOCKER_HOST", DEFAULT_SOCKET)
    started = not _answers(host)
    if started:
        run = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"scripts/dockerd.sh start failed:\n{run.stderr[-3000:]}"
        host = run.stdout.strip().splitlines()[-1].split("=", 1)[1]
    saved = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = host
    try:
        yield host
    finally:
        if saved is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = saved
        if started:
            subprocess.run([str(SCRIPT), "stop"], capture_output=True, timeout=120)


def image_build(docker_host: str, cache: Path, *args: str) -> subprocess.CompletedProcess:
    """`tracetap image build ARGS` against the tier's engine, with the image cache that outlives a run."""
    env = {**os.environ, "DOCKER_HOST": docker_host, "TRACETAP_IMAGES_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "tracetap.cli", "image", "build", *args], env=env,
                          capture_output=True, text=True, timeout=1800)


def image_tag(built: subprocess.CompletedProcess) -> str:
    """The tag a successful build printed last."""
    assert built.returncode == 0, built.stderr
    return built.stdout.strip().splitlines()[-1]


def labelled(label: str, base_url: str | None = None) -> list:
    """Containers in any state carrying `label` (`key=value`), in the engine at `base_url` (default: $DOCKER_HOST)."""
    client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
    try:
        return client.containers.list(all=True, filters={"label": label})
    finally:
        client.close()
