"""The base image: the Debian rootfs plus Node.js and the harness CLIs from npm, tagged by what went in.

Each CLI is installed on the host with npm (rollout/harnesses/npm.py, at the package spec its preset
names) into a prefix of its own under the images cache dir, then copied into its own image layer; its
binary is linked into /usr/local/bin, which every login shell has on PATH. Node.js is the host's (the
CLIs need Node 20, Debian bookworm ships 18). The tag `tracetap-base:<hash12>` hashes the Dockerfile (which
names the rootfs recipe's tag), the Node.js and npm versions and each CLI's package-lock.json, so a second
build of the same set is a lookup by tag, and adding a CLI reuses the rootfs and the layers before it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import docker
from tracetap.engine.cache import home_dir
from tracetap.rollout.harnesses import cli_harness, npm
from tracetap.rollout.harnesses.cli import CliHarness
from tracetap.rollout.images.daemon import ImageError, Log, build, digest, has_image
from tracetap.rollout.images.rootfs import ensure_rootfs, rootfs_tag

REPOSITORY = "tracetap-base"
RECIPE = 1             # bump when the layout below changes
IMAGE_NPM = "/opt/tracetap/npm"  # CLI prefixes inside the image: IMAGE_NPM/<harness>
MIN_NODE = 20


@dataclass(frozen=True)
class NodeRuntime:
    binary: Path   # the host's node executable
    npm_dir: Path  # its bundled npm package
    version: str   # `node --version`, e.g. v20.20.2
    npm_version: str


@dataclass(frozen=True)
class CliLayer:
    preset: CliHarness
    prefix: Path   # host npm prefix holding this CLI alone
    version: str   # the installed package's version
    lock_sha: str  # sha256 of the prefix's package-lock.json: every resolved dependency


@dataclass(frozen=True)
class BaseImage:
    tag: str
    cached: bool   # it was there already: nothing was built
    rootfs: str
    node: str
    clis: dict[str, str] = field(default_factory=dict)  # harness -> CLI version
    seconds: float = 0.0


def images_dir() -> Path:
    """`$TRACETAP_IMAGES_DIR`, else `$TRACETAP_HOME/images`: the rootfs tarball and the per-CLI npm prefixes."""
    return Path(os.environ.get("TRACETAP_IMAGES_DIR") or home_dir() / "images")


def build_base_image(client: docker.DockerClient, harnesses: Sequence[str], cache_dir: Path | None = None,
                     log: Log = lambda line: None) -> BaseImage:
    """The base image with these CLIs (names or aliases), built unless its tag exists; ImageError on failure."""
    started = time.monotonic()
    cache_dir = cache_dir or images_dir()
    layers = [cli_layer(preset, cache_dir / "npm" / preset.name, log) for preset in presets(harnesses)]
    node = node_runtime()
    dockerfile = render_dockerfile(rootfs_tag(), node, layers)
    tag = f"{REPOSITORY}:{digest(('base', RECIPE, dockerfile, node.npm_version, [layer.lock_sha for layer in layers]))}"
    clis = {layer.preset.name: layer.version for layer in layers}
    cached = has_image(client, tag)
    if not cached:
        ensure_rootfs(client, cache_dir, log)
        _build(client, tag, dockerfile, node, layers, cache_dir, log)
    return BaseImage(tag, cached, rootfs_tag(), node.version, clis, time.monotonic() - started)


def presets(names: Sequence[str]) -> list[CliHarness]:
    """The CLI presets, each once, in name order (the same set always gives the same Dockerfile)."""
    try:
        found = {cli_harness(name).name: cli_harness(name) for name in names}
    except KeyError as error:
        raise ImageError(f"no CLI harness named {error.args[0]!r}") from None
    return [found[name] for name in sorted(found)]


def cli_layer(preset: CliHarness, prefix: Path, log: Log) -> CliLayer:
    """The CLI installed alone in `prefix` (npm install on first use, reused as it is after)."""
    if not (npm.bin_dir(prefix) / preset.binary).exists():
        log(f"npm install {preset.package} into {prefix}")
    try:
        npm.install([preset], prefix)
    except (OSError, subprocess.SubprocessError) as error:
        raise ImageError(f"{preset.name}: npm install {preset.package} failed: {error}") from None
    lock = prefix / "package-lock.json"
    if not lock.exists():
        raise ImageError(f"{preset.name}: {lock} is missing; remove {prefix} to reinstall")
    package = json.loads((prefix / "node_modules" / package_name(preset.package) / "package.json").read_text())
    return CliLayer(preset, prefix, package["version"], hashlib.sha256(lock.read_bytes()).hexdigest())


def package_name(spec: str) -> str:
    """`@scope/name@range` -> `@scope/name`, `name@range` -> `name`."""
    scope, _, rest = spec.rpartition("/")
    return f"{scope}/{rest.split('@')[0]}" if scope else spec.split("@")[0]


def node_runtime() -> NodeRuntime:
    """The host's Node.js (and its npm), checked to be new enough for the CLIs."""
    found = shutil.which("node")
    if found is None:
        raise ImageError("node is not installed on this host (the base image copies the host's Node.js)")
    binary = Path(found).resolve()
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < MIN_NODE:
        raise ImageError(f"node {version} is too old: the harness CLIs need Node {MIN_NODE} or newer")
    npm_dir = binary.parent.parent / "lib" / "node_modules" / "npm"
    npm_version = json.loads((npm_dir / "package.json").read_text())["version"]
    return NodeRuntime(binary, npm_dir, version, npm_version)


def render_dockerfile(rootfs: str, node: NodeRuntime, layers: Sequence[CliLayer]) -> str:
    clis = " ".join(f"{layer.preset.name}={layer.version}" for layer in layers)
    steps = [f"FROM {rootfs}", "COPY node/ /", *(f"COPY cli-{layer.preset.name}/ /" for layer in layers)]
    labels = f'LABEL org.tracetap.node="{node.version}" org.tracetap.clis="{clis}"'
    return "\n".join([*steps, labels, 'CMD ["bash"]', ""])


def _build(client: docker.DockerClient, tag: str, dockerfile: str, node: NodeRuntime, layers: Sequence[CliLayer],
           cache_dir: Path, log: Log) -> None:
    log(f"building {tag}")
    cache_dir.mkdir(parents=True, exist_ok=True)  # a base without CLIs on a cached rootfs made nothing there yet
    with tempfile.TemporaryDirectory(prefix=".context-", dir=cache_dir) as scratch:
        context = Path(scratch) / "context.tar"
        write_context(context, dockerfile, node, layers)
        build(client, context, tag, log=log)


def write_context(path: Path, dockerfile: str, node: NodeRuntime, layers: Sequence[CliLayer]) -> None:
    """The build context: one folder per COPY, laid out as it lands under / in the image."""
    with tarfile.open(path, "w") as tar:
        add_text(tar, "Dockerfile", dockerfile)
        tar.add(node.binary, "node/usr/local/bin/node", filter=as_root)
        tar.add(node.npm_dir, "node/usr/local/lib/node_modules/npm", filter=as_root)
        for command in ("npm", "npx"):
            add_link(tar, f"node/usr/local/bin/{command}", f"../lib/node_modules/npm/bin/{command}-cli.js")
        for layer in layers:
            name, binary = layer.preset.name, layer.preset.binary
            tar.add(layer.prefix, f"cli-{name}{IMAGE_NPM}/{name}", filter=as_root)
            add_link(tar, f"cli-{name}/usr/local/bin/{binary}", f"{IMAGE_NPM}/{name}/node_modules/.bin/{binary}")


def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def add_text(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode()
    info = as_root(tarfile.TarInfo(name))
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = as_root(tarfile.TarInfo(name))
    info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
    tar.addfile(info)
