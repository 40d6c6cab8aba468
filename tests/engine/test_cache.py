"""build_once: a cache folder appears complete or not at all, even with racing builders."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from tracetap.engine.cache import build_once, home_dir


def test_home_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRACETAP_HOME", str(tmp_path))
    assert home_dir() == tmp_path
    monkeypatch.delenv("TRACETAP_HOME")
    assert home_dir() == Path.home() / ".cache" / "tracetap"


def test_builds_once_then_reuses(tmp_path: Path) -> None:
    calls = []

    def build(folder: Path) -> None:
        calls.append(folder)
        (folder / "data").write_text("x")

    target = tmp_path / "deep" / "thing"
    assert build_once(target, build) == target and build_once(target, build) == target
    assert len(calls) == 1 and (target / "data").read_text() == "x"
    assert [p.name for p in target.parent.iterdir()] == ["thing"]  # no scratch left behind


def test_racing_builders_leave_one_complete_copy(tmp_path: Path) -> None:
    target = tmp_path / "thing"

    def build(folder: Path) -> None:
        (folder / "part1").write_text("a")
        time.sleep(0.05)
        (folder / "part2").write_text("b")

    results = []
    threads = [threading.Thread(target=lambda: results.append(build_once(target, build))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [target] * 4
    assert sorted(p.name for p in target.iterdir()) == ["part1", "part2"]
    assert [p.name for p in tmp_path.iterdir()] == ["thing"]


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    def build(folder: Path) -> None:
        (folder / "half").write_text("a")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        build_once(tmp_path / "thing", build)
    assert list(tmp_path.iterdir()) == []
