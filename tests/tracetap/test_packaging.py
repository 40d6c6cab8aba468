"""The wheel installs one top-level package, `tracetap`, so it lives beside packages named `queries`,
`store` or `report` (all real names on the package index) without either breaking the other."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the tracked sources (the checkout stays untouched)."""
    src = tmp_path_factory.mktemp("src")
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    for name in tracked.stdout.splitlines():
        if not (REPO / name).is_file() or name.startswith("tests/"):
            continue
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes((REPO / name).read_bytes())
    out = tmp_path_factory.mktemp("dist")
    _pip(sys.executable, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(src))
    return next(out.glob("tracetap-*.whl"))


def test_wheel_top_level_is_tracetap_alone(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"tracetap", "tracetap-0.1.0.dist-info"}
    for package in ("capture", "capture/adapters", "capture/adapters/schemas", "engine", "store", "builders",
                    "evaluators", "queries", "report", "commands"):
        assert f"tracetap/{package}/__init__.py" in names
    assert "tracetap/queries/error_rates.sql" in names
    assert "tracetap/engine/chat_template.jinja" in names
    assert "tracetap/demo_data/script.jsonl" in names


def test_installs_beside_a_package_named_queries(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the fresh venv borrows our dependencies (never our sources) so that imports below run for real
    (site / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _pip(python, "install", "--no-deps", "--no-index", str(_queries_wheel(tmp_path)))
    _pip(python, "install", "--no-deps", "--no-index", str(wheel))
    check = ("import queries, tracetap.queries, tracetap.store, tracetap.capture.service, tracetap.builders;"
             "assert queries.WHO == 'the other queries';"
             "assert tracetap.queries.QUERY_DIR.joinpath('error_rates.sql').is_file();"
             "print(tracetap.store.__file__)")
    done = subprocess.run([python, "-c", check], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(site))


def _queries_wheel(tmp_path: Path) -> Path:
    """A minimal wheel of a distribution whose top-level package is `queries`."""
    path = tmp_path / "queries-1.0-py3-none-any.whl"
    files = {
        "queries/__init__.py": "WHO = 'the other queries'\n",
        "queries-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: queries\nVersion: 1.0\n",
        "queries-1.0.dist-info/WHEEL": ("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-any\n"),
    }
    record = "".join(f"{name},,\n" for name in files) + "queries-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as whl:
        for name, text in {**files, "queries-1.0.dist-info/RECORD": record}.items():
            whl.writestr(name, text)
    return path


def _pip(python: str, *args: str) -> None:
    done = subprocess.run([python, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
