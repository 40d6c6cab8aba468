"""The Docker API calls the image builders share: connect, look an image up by tag, build a context tar.

Builds run with no network (`network_mode=none`, `pull=False`): there is no registry to pull from, and a
Dockerfile step that would download something fails with the daemon's message instead of hanging.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import docker
from docker.errors import DockerException, ImageNotFound

API_TIMEOUT = 1800.0  # seconds one API call may take (an import or a build step)
LOG_TAIL = 25         # build output lines quoted in an ImageError
TAG = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,127}:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")

Log = Callable[[str], None]


class ImageError(RuntimeError):
    """An image could not be built or found; the message says why (with the build's output)."""


def connect(base_url: str | None = None) -> docker.DockerClient:
    """A client for `base_url`, else `$DOCKER_HOST`; ImageError when nothing answers there."""
    url = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.DockerClient(base_url=url, timeout=API_TIMEOUT)
        client.ping()
    except DockerException as error:
        raise ImageError(f"no Docker API answers at {url} (start one with scripts/dockerd.sh start): {error}") \
            from None
    return client


def check_tag(tag: str) -> str:
    """`tag` if it is a plain local `name:tag` reference, else ValueError."""
    if not TAG.match(tag):
        raise ValueError(f"not an image tag of the form name:tag: {tag!r}")
    return tag


def has_image(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except ImageNotFound:
        return False
    return True


def digest(parts: object) -> str:
    """The first 12 hex digits of the sha256 of `repr(parts)` (parts are plain data: str, tuples, dicts)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def build(client: docker.DockerClient, context_tar: Path, tag: str, *, buildargs: Mapping[str, str] | None = None,
          dockerfile: str = "Dockerfile", log: Log | None = None) -> None:
    """Build the context tar into `tag`; ImageError with the failing step and the output's tail."""
    lines: list[str] = []
    with context_tar.open("rb") as context:
        stream = client.api.build(fileobj=context, custom_context=True, tag=tag, dockerfile=dockerfile,
                                  buildargs=dict(buildargs or {}), pull=False, rm=True, forcerm=True,
                                  network_mode="none", decode=True)
        error = _follow(stream, lines, log)
    if error is not None:
        tail = "".join(lines[-LOG_TAIL:])
        raise ImageError(f"building {tag} failed: {error.strip()}\n--- build output (last lines) ---\n{tail}")


def _follow(stream: Iterable[dict], lines: list[str], log: Log | None) -> str | None:
    """Collect the build's output lines; the daemon's error message, or None when the build succeeded."""
    for chunk in stream:
        if "error" in chunk:
            return str(chunk["error"])
        text = chunk.get("stream", "")
        if text.strip():
            lines.append(text)
            if log is not None:
                log(text.rstrip("\n"))
    return None


def copy_image(source: docker.DockerClient, target: docker.DockerClient, tag: str, log: Log | None = None) -> bool:
    """Load `tag` from one engine into another (dockerd -> rootless podman's store) unless it is there;
    True when it was copied."""
    if has_image(target, tag):
        return False
    if log is not None:
        log(f"copying {tag} into {target.api.base_url}")
    try:
        target.images.load(source.images.get(tag).save(named=True))
    except DockerException as error:
        raise ImageError(f"copying {tag} failed: {error}") from None
    if not has_image(target, tag):
        raise ImageError(f"copying {tag}: the target engine loaded the archive but has no image {tag}")
    return True
