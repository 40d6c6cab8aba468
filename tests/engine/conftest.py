"""Shared engine fixtures: one private cache (tokenizer + tiny model) and servers reused across the tests."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.server import EngineServer
from engine.tokenizer import ChatTokenizer, load_tokenizer

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


@pytest.fixture(scope="session", autouse=True)
def engine_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """TRACETAP_HOME and TIKTOKEN_CACHE_DIR in temp dirs for the whole session (the build happens once)."""
    home = tmp_path_factory.mktemp("tracetap-home")
    saved = {key: os.environ.get(key) for key in ("TRACETAP_HOME", "TIKTOKEN_CACHE_DIR")}
    os.environ["TRACETAP_HOME"] = str(home)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(tmp_path_factory.mktemp("tiktoken"))
    yield home
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def tokenizer(engine_home: Path) -> ChatTokenizer:
    return load_tokenizer()


@pytest.fixture(scope="session")
def server(engine_home: Path) -> Iterator[EngineServer]:
    """A sampling engine on a free loopback port."""
    with EngineServer(seed=0) as running:
        yield running


@pytest.fixture(scope="session")
def script_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("script") / "replies.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in SCRIPT) + "\n")
    return path


@pytest.fixture()
def scripted(engine_home: Path, script_file: Path) -> Iterator[EngineServer]:
    """A scripted engine (fresh per test, so every session starts at the first line)."""
    with EngineServer(script=script_file, served_model="scripted-tiny") as running:
        yield running
