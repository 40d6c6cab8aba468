"""The harness tier: the six real coding-agent CLIs from npm, run as rollout sessions on a local node.

Every test in this folder carries the `harness` marker, so the default run (addopts `-m 'not harness ...'`)
leaves them out and `pytest -m harness tests/harness` runs them. The CLIs are installed once into the npm
prefix (tests/cli_sessions.py says where) and reused from there; `tracetap demo --harness NAME` finds them
in the same place. A failed install fails the tier; nothing here is skipped.
"""

from __future__ import annotations

from pathlib import Path

import cli_sessions
import pytest
from tracetap.rollout.harnesses import CLI_HARNESSES

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.harness)


@pytest.fixture(scope="session")
def installed():
    """Every CLI, installed with npm when missing; name -> binary."""
    with cli_sessions.installed(list(CLI_HARNESSES)) as binaries:
        yield binaries
