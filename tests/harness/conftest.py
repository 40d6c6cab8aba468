"""The harness tier: real coding-agent CLIs from npm, run one-shot through a real gateway.

Every test in this folder carries the `harness` marker, so the default run (addopts `-m 'not harness ...'`)
leaves them out and `pytest -m harness tests/harness` runs them. The CLIs are installed once into the npm
cache dir (`$TRACETAP_NPM_DIR`, else `$TRACETAP_HOME/npm` as set before the tests start, default
`~/.cache/tracetap/npm`) and reused from there; `tracetap demo --harness NAME` finds them in the same place.
A failed install fails the tier; nothing here is skipped.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracetap import harnesses
from tracetap.launch import GatewayProcess, start_gateway

# Read at import, before the session fixture points TRACETAP_HOME at a temp dir: installs outlive a run.
NPM_DIR = harnesses.npm_dir()
HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.harness)


@pytest.fixture(scope="session")
def npm_dir() -> Path:
    return NPM_DIR


@pytest.fixture(scope="session")
def installed(npm_dir: Path) -> dict[str, Path]:
    """Every CLI, installed with npm when missing; name -> binary."""
    presets = list(harnesses.HARNESSES.values())
    harnesses.install(presets, npm_dir)
    return {h.name: harnesses.require_binary(h, npm_dir) for h in presets}


class Gateways:
    """Gateways with the embedded engine playing a script, one per test.

    `release(gateway)`, once the test has read the store, sends SIGTERM and returns: the clean shutdown
    (several seconds) overlaps the next test. The run waits for every gateway at the end.
    """

    def __init__(self) -> None:
        self.started: list[GatewayProcess] = []

    def start(self, store: Path, script: Path) -> GatewayProcess:
        self.started.append(start_gateway(store, "--script", str(script), *harnesses.GATEWAY_ARGS))
        return self.started[-1]

    @staticmethod
    def release(gateway: GatewayProcess) -> None:
        if gateway.process.poll() is None:
            gateway.process.send_signal(signal.SIGTERM)

    def stop_all(self) -> None:
        for gateway in self.started:
            gateway.stop()


@pytest.fixture(scope="session")
def gateways() -> Iterator[Gateways]:
    running = Gateways()
    yield running
    running.stop_all()
