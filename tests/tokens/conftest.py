"""The engine's Qwen3 tokenizer, built once per run into the session's `tracetap_home`."""

from __future__ import annotations

from pathlib import Path

import pytest
from tracetap.engine.tokenizer import ChatTokenizer, load_tokenizer


@pytest.fixture(scope="session")
def tokenizer(tracetap_home: Path) -> ChatTokenizer:
    return load_tokenizer()
