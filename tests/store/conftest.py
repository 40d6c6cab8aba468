"""Store fixtures: a store root and an open writer on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tracetap.store import StoreWriter


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def writer(root: Path) -> Iterator[StoreWriter]:
    with StoreWriter(root) as w:
        yield w
