"""Task images: a task's Dockerfile (a Harbor task's environment dir) built on top of a base image.

The Dockerfile names its base as `FROM ${BASE_IMAGE}` (after `ARG BASE_IMAGE`); the build passes the base
tag in that build arg. No registry is reachable, so every FROM must name an image the daemon already has.
"""

from __future__ import annotations

import re
import tarfile
import tempfile
from pathlib import Path

import docker
from tracetap.rollout.images.daemon import ImageError, Log, build, check_tag, digest, has_image

REPOSITORY = "tracetap-task"
FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", re.IGNORECASE | re.MULTILINE)


def build_task_image(context_dir: Path, base_tag: str, client: docker.DockerClient, log: Log | None = None) -> str:
    """`tracetap-task:<hash12>` of the context and the base, built unless it exists; ImageError on failure."""
    dockerfile = context_dir / "Dockerfile"
    if not dockerfile.is_file():
        raise ImageError(f"{context_dir}: no Dockerfile")
    if not has_image(client, check_tag(base_tag)):
        raise ImageError(f"base image {base_tag} is not built here (run `tracetap image build`)")
    check_bases(dockerfile.read_text(), base_tag, client)
    tag = f"{REPOSITORY}:{digest((client.images.get(base_tag).id, context_digest(context_dir)))}"
    if not has_image(client, tag):
        with tempfile.TemporaryDirectory(prefix="tracetap-context-") as scratch:
            context = Path(scratch) / "context.tar"
            with tarfile.open(context, "w") as tar:
                tar.add(context_dir, ".")
            build(client, context, tag, buildargs={"BASE_IMAGE": base_tag}, log=log)
    return tag


def check_bases(text: str, base_tag: str, client: docker.DockerClient) -> None:
    """Every FROM names the base, an earlier stage, scratch or a local image; else the daemon would pull."""
    stages: set[str] = set()
    for match in FROM.finditer(text):
        image = match.group(1).replace("${BASE_IMAGE}", base_tag).replace("$BASE_IMAGE", base_tag)
        if image not in stages and image != "scratch" and not has_image(client, image):
            raise ImageError(f"FROM {match.group(1)}: no such image here and no registry to pull from "
                             f"(use `ARG BASE_IMAGE` and `FROM ${{BASE_IMAGE}}`)")
        stages.add((match.group(2) or "").lower())


def context_digest(context_dir: Path) -> list[tuple[str, int, bytes]]:
    """Path, mode and content of every file in the context (what the build sees)."""
    return [(str(p.relative_to(context_dir)), p.stat().st_mode, p.read_bytes())
            for p in sorted(context_dir.rglob("*")) if p.is_file()]
