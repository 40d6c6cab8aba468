"""The Debian layer: a minimal bookworm root filesystem from debootstrap, imported with `docker import`.

The rootfs is made once per recipe (suite, variant, package list): its tarball is kept in the images cache
dir and the imported image is tagged `tracetap-rootfs:<hash12>`, so a base image that adds a harness reuses
it; only a changed recipe runs debootstrap (~1 min) again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import docker
from tracetap.rollout.images.daemon import ImageError, Log, digest, has_image

SUITE, VARIANT = "bookworm", "minbase"
# libstdc++6 is the one library Node.js needs beyond minbase; patch is SWE-bench's last apply fallback and
# python3-pytest runs SWE-bench-format tests (pip cannot reach a package index from inside a container)
PACKAGES = ("bash", "ca-certificates", "git", "python3", "python3-venv", "procps", "iproute2", "libstdc++6",
            "patch", "less", "python3-pytest")
REPOSITORY = "tracetap-rootfs"
DEBOOTSTRAP_TIMEOUT = 1200.0


def mirror() -> str:
    """The Debian mirror debootstrap fetches from (not part of the recipe: every mirror serves the same)."""
    return os.environ.get("TRACETAP_DEBIAN_MIRROR", "http://deb.debian.org/debian")


def rootfs_tag() -> str:
    return f"{REPOSITORY}:{digest(('rootfs', 1, SUITE, VARIANT, sorted(PACKAGES)))}"


def ensure_rootfs(client: docker.DockerClient, cache_dir: Path, log: Log) -> str:
    """The rootfs image's tag, importing the cached tarball (made first when missing) if the daemon lacks it."""
    tag = rootfs_tag()
    if has_image(client, tag):
        return tag
    tarball = cache_dir / f"{tag.replace(':', '-')}.tar"
    if not tarball.exists():
        make_tarball(tarball, log)
    log(f"importing {tarball} as {tag}")
    repository, name = tag.split(":")
    client.api.import_image_from_file(str(tarball), repository=repository, tag=name, changes=['CMD ["bash"]'])
    return tag


def make_tarball(target: Path, log: Log) -> None:
    """debootstrap into a scratch dir and tar it to `target` (written aside and renamed: never half there)."""
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is not installed (apt-get install debootstrap)")
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".rootfs-", dir=target.parent))
    try:
        root = scratch / "root"
        log(f"debootstrap --variant={VARIANT} {SUITE} with {','.join(PACKAGES)} (about a minute)")
        _run(["debootstrap", f"--variant={VARIANT}", f"--include={','.join(PACKAGES)}", SUITE, str(root),
              mirror()], "debootstrap")
        _trim(root)
        _run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(scratch / "rootfs.tar"), "."], "tar")
        os.rename(scratch / "rootfs.tar", target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _trim(root: Path) -> None:
    """Drop what debootstrap leaves that an image does not need (downloaded .debs, apt lists)."""
    for folder in (root / "var/cache/apt/archives", root / "var/lib/apt/lists"):
        for entry in folder.glob("*"):
            if entry.is_file():
                entry.unlink()


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=DEBOOTSTRAP_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ImageError(f"{what} did not finish in {DEBOOTSTRAP_TIMEOUT:.0f} s") from None
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-3000:]
        raise ImageError(f"{what} failed (exit {done.returncode}; it needs root and the Debian mirror "
                         f"{mirror()}):\n{output}")
