"""The built-in agent's image (`tracetap demo --runtime docker`): the base image plus a Python venv with the
openai SDK and pytest, and tracetap's agent module itself (the same file the local demo runs).

Containers have no network, so the host downloads the wheels (pip, at the versions installed here; the
image's Debian bookworm Python is 3.11 like the host's) and the build installs them with `--no-index`. They
are kept in the images cache dir by their pins. `python` in the image is the venv's, so the agent's
`python -m pytest` finds pytest. The tag is a task image's: a hash of the base and the context.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import docker
from tracetap.rollout.images.base import build_base_image, images_dir
from tracetap.rollout.images.daemon import ImageError, Log, digest
from tracetap.rollout.images.task import build_task_image

import tracetap
import tracetap.agent

PACKAGES = ("openai", "pytest")
VENV = "/opt/tracetap/venv"
DOWNLOAD_TIMEOUT = 600.0


def pins() -> list[str]:
    """`name==version` of each package as installed on this host."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in PACKAGES]


def dockerfile(requirements: list[str]) -> str:
    site = f"{VENV}/lib/python3.11/site-packages"
    install = (f"python3 -m venv {VENV} && {VENV}/bin/pip install -q --no-index --find-links /tmp/wheels "
               f"{' '.join(requirements)} && rm -rf /tmp/wheels")
    wrapper = f"printf '#!/bin/sh\\nexec {VENV}/bin/python \"$@\"\\n' >/usr/local/bin/python"
    return "\n".join(["ARG BASE_IMAGE", "FROM ${BASE_IMAGE}", "COPY wheels/ /tmp/wheels/",
                      f"RUN {install} && {wrapper} && chmod 755 /usr/local/bin/python",
                      f"COPY tracetap/ {site}/tracetap/", ""])


def download_wheels(requirements: list[str], cache_dir: Path, log: Log) -> Path:
    """The wheels of `requirements` and their dependencies, downloaded once per set of pins."""
    target = cache_dir / "wheels" / digest(("wheels", sys.version_info[:2], requirements))
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".wheels-", dir=target.parent))
    log(f"pip download {' '.join(requirements)}")
    argv = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:",
            "-d", str(scratch), *requirements]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT)
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess(argv, 1, "", f"no answer in {DOWNLOAD_TIMEOUT:.0f} s")
    if done.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise ImageError(f"pip download {' '.join(requirements)} failed:\n{done.stderr[-2000:]}")
    os.rename(scratch, target)
    return target


def build_agent_image(client: docker.DockerClient, log: Log = lambda line: None) -> str:
    """The agent image's tag, built unless it exists (the base image, without CLIs, first)."""
    cache_dir = images_dir()
    base = build_base_image(client, [], cache_dir, log)
    requirements = pins()
    wheels = download_wheels(requirements, cache_dir, log)
    with tempfile.TemporaryDirectory(prefix="tracetap-agent-") as scratch:
        context = Path(scratch)
        (context / "Dockerfile").write_text(dockerfile(requirements))
        shutil.copytree(wheels, context / "wheels")
        (context / "tracetap").mkdir()
        for module in (tracetap, tracetap.agent):
            source = Path(str(module.__file__))
            shutil.copyfile(source, context / "tracetap" / source.name)
        return build_task_image(context, base.tag, client, log)
