"""The vllm tier: the gateway in front of a real vLLM server (CPU build), driven by the official SDKs.

Every test in this folder carries the `vllm` marker, so the default run leaves them out and
`pytest -m vllm tests/vllm` runs them. vLLM's venv is installed on first use and reused
(tests/vllm_venv.py); one server serves the whole session (tests/vllm_server.py) and is stopped by its
process group at the end. A failed install or start fails the tier; nothing here is skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import vllm_server
import vllm_venv

HERE = Path(__file__).parent
SERVER = pytest.StashKey[vllm_server.VllmServer]()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def vllm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tracetap_home: Path):
    """The session's vLLM server (`.url`, `.tokenize(body)`, `.log()`)."""
    server = vllm_server.start(vllm_venv.ensure(), tmp_path_factory.mktemp("vllm"))
    request.config.stash[SERVER] = server
    yield server
    server.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed test here shows the tail of the vLLM server's log beside its traceback."""
    report = yield
    server = item.config.stash.get(SERVER, None)
    if report.failed and server is not None:
        report.sections.append(("vLLM server log (tail)", server.log()[-4000:]))
    return report
