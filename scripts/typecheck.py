"""Run mypy on the `tracetap.*` package and the benchmarks (`make lint`, scripts/test.sh).

The top-level folders install as `tracetap.<folder>` through setuptools' package-dir, which mypy
cannot follow in an editable install. So this builds the package as the wheel lays it out, in a temp
tree of symlinks (`tracetap/capture -> <repo>/capture`, ...) read from pyproject.toml, and checks it
there with the repo's `[tool.mypy]` settings. Errors are reported with the repo's own paths.

    python scripts/typecheck.py [extra mypy args]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXTRA_FOLDERS = ("benchmarks",)  # checked as loose scripts next to the package


def package_dirs() -> dict[str, Path]:
    """`tracetap.<name>` -> its folder in the repo, from [tool.setuptools.package-dir]."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {name: REPO / folder for name, folder in config["tool"]["setuptools"]["package-dir"].items()}


def build_tree(root: Path) -> Path:
    """The `tracetap` package under `root`: the real top folder's files, each mapped folder linked."""
    mapped = package_dirs()
    package = root / "tracetap"
    package.mkdir()
    for entry in mapped.pop("tracetap").iterdir():
        (package / entry.name).symlink_to(entry)
    for name, folder in mapped.items():
        (package / name.removeprefix("tracetap.")).symlink_to(folder)
    for folder in EXTRA_FOLDERS:
        (root / folder).symlink_to(REPO / folder)
    return root


def main(args: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="tracetap-mypy-") as tmp:
        root = build_tree(Path(tmp))
        command = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                   "--cache-dir", str(REPO / ".mypy_cache"), "tracetap", *EXTRA_FOLDERS, *args]
        result = subprocess.run(command, cwd=root, env={**os.environ, "MYPYPATH": str(root)},
                                capture_output=True, text=True)
    sys.stdout.write(result.stdout.replace(f"{root}/", ""))
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
