"""Shared engine fixtures: servers reused across the tests. The private cache (tokenizer + tiny model) is
`tracetap_home` from tests/conftest.py, so they are built once per test run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import live
import pytest
from tracetap.engine.server import EngineServer
from tracetap.engine.tokenizer import ChatTokenizer, load_tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"

LS = {"function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
SCRIPT = [
    {"content": "Let me look.", "tool_calls": [LS]},
    {"content": "There are three files.", "reasoning": "The listing shows README.md, main.py and setup.cfg."},
    {"content": "Anything else?"},
]


class VllmFixtures:
    """Real vLLM 0.32 responses by name; `NAME.request` is the request that produced NAME."""

    def __call__(self, name: str) -> dict:
        return json.loads(self.text(f"{name}.json"))

    def text(self, filename: str) -> str:
        return (FIXTURES / filename).read_text()


@pytest.fixture(scope="session")
def vllm() -> VllmFixtures:
    return VllmFixtures()


@pytest.fixture(scope="session")
def tokenizer(tracetap_home: Path) -> ChatTokenizer:
    return load_tokenizer()


@pytest.fixture(scope="session")
def server(tracetap_home: Path) -> Iterator[EngineServer]:
    """A sampling engine on a free loopback port."""
    with EngineServer(seed=0) as running:
        yield running


@pytest.fixture(scope="session")
def script_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return live.write_script(tmp_path_factory.mktemp("script") / "replies.jsonl", SCRIPT)


@pytest.fixture()
def scripted(tracetap_home: Path, script_file: Path) -> Iterator[EngineServer]:
    """A scripted engine (fresh per test, so every session starts at the first line)."""
    with EngineServer(script=script_file, served_model="scripted-tiny") as running:
        yield running
