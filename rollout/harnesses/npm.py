"""The coding-agent CLIs come from npm: one shared install prefix, reused by every run and test.

The prefix is `$TRACETAP_NPM_DIR`, else `$TRACETAP_HOME/npm` (default `~/.cache/tracetap/npm`). A CLI is
looked up there first, then on PATH; a missing one is a `HarnessError` that names the install command.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from tracetap.engine.cache import home_dir


class HarnessError(RuntimeError):
    """A harness CLI is not installed."""


class NpmCli(Protocol):
    name: str
    package: str  # the npm package spec to install
    binary: str   # the command it puts in node_modules/.bin


def npm_dir() -> Path:
    return Path(os.environ.get("TRACETAP_NPM_DIR") or home_dir() / "npm")


def bin_dir(prefix: Path | None = None) -> Path:
    return (prefix or npm_dir()) / "node_modules" / ".bin"


def find_binary(cli: NpmCli, prefix: Path | None = None) -> Path | None:
    """The CLI from the npm prefix, else from PATH; None when it is not installed."""
    cached = bin_dir(prefix) / cli.binary
    if cached.exists():
        return cached
    found = shutil.which(cli.binary)
    return Path(found) if found else None


def require_binary(cli: NpmCli, prefix: Path | None = None) -> Path:
    """The installed CLI, or a HarnessError that says how to install it."""
    binary = find_binary(cli, prefix)
    if binary is None:
        raise HarnessError(
            f"{cli.name}: `{cli.binary}` is not installed (looked in {bin_dir(prefix)} and on PATH). "
            f"Install it with:\n  " + shlex.join(install_command([cli], prefix)))
    return binary


def install_command(clis: Sequence[NpmCli], prefix: Path | None = None) -> list[str]:
    return ["npm", "install", "--prefix", str(prefix or npm_dir()), "--no-audit", "--no-fund",
            "--loglevel", "error", *(cli.package for cli in clis)]


def install(clis: Sequence[NpmCli], prefix: Path | None = None, timeout: float = 900.0) -> None:
    """`npm install` the CLIs missing from the prefix (an installed one is reused as it is)."""
    prefix = prefix or npm_dir()
    missing = [cli for cli in clis if not (bin_dir(prefix) / cli.binary).exists()]
    if missing:
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(install_command(missing, prefix), check=True, timeout=timeout, stdin=subprocess.DEVNULL)
