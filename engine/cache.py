"""Where the engine keeps what it builds once (tokenizer, tiny model), and how it builds it safely."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def home_dir() -> Path:
    """`$TRACETAP_HOME`, or `~/.cache/tracetap`: the root of every engine cache."""
    return Path(os.environ.get("TRACETAP_HOME") or Path.home() / ".cache" / "tracetap")


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return `target`, building it first if absent.

    The build writes into a temporary sibling that is renamed into place, so readers never see a
    half-built cache and two processes building at once both end up with one complete copy.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(scratch)
        os.rename(scratch, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
