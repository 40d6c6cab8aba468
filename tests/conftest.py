"""Shared fixtures: a private TRACETAP_HOME, and factories for real engine, gateway and stub processes.

    engine(script=None) -> live.EngineProcess        `tracetap engine` child; `.url`
    gateway(*args, store=None) -> live.GatewayProcess `tracetap gateway --store S ARGS`; `.url`, `.store`
    stub_upstream -> live.StubUpstream                replays tests/fixtures/vllm-0.32.0 by session id

Everything a factory starts is stopped (by pid) when the test ends. For one process per module,
use the helpers in tests/live.py directly in a module-scoped fixture.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import live
import pytest
from tracetap.rollout.images.base import images_dir

# Read at collection, before the session fixture moves TRACETAP_HOME: the rootfs and npm caches of the
# container images outlive a run.
IMAGES_CACHE = images_dir()


@pytest.fixture(scope="session", autouse=True)
def tracetap_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache home per test run (tokenizer and tiny model are built once), inherited by children."""
    home = tmp_path_factory.mktemp("tracetap-home")
    saved = {k: os.environ.get(k) for k in ("TRACETAP_HOME", "TIKTOKEN_CACHE_DIR")}
    os.environ.update(TRACETAP_HOME=str(home), TIKTOKEN_CACHE_DIR=str(home / "tiktoken"))
    yield home
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def engine(tmp_path: Path):
    started: list[live.EngineProcess] = []

    def start(script: Path | None = None) -> live.EngineProcess:
        started.append(live.start_engine(tmp_path / "engine", script))
        return started[-1]

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def gateway(tmp_path: Path):
    started: list[live.GatewayProcess] = []

    def start(*args: str, store: Path | None = None, timeout: float = 120.0) -> live.GatewayProcess:
        started.append(live.start_gateway(store or tmp_path / "store", *args, timeout=timeout))
        return started[-1]

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def stub_upstream():
    with live.StubUpstream() as stub:
        yield stub


@pytest.fixture(scope="session")
def docker_host() -> str:
    """The Docker engine of the `docker` tier (see tests/docker_daemon.py)."""
    from docker_daemon import docker_daemon

    yield from docker_daemon()


@pytest.fixture(scope="session")
def images_cache() -> Path:
    return IMAGES_CACHE


@pytest.fixture(scope="session")
def image_build(docker_host: str):
    """`image_build(*args)` runs `tracetap image build ARGS` in the tier's engine with the lasting cache."""
    from docker_daemon import image_build

    return functools.partial(image_build, docker_host, IMAGES_CACHE)


@pytest.fixture(scope="session")
def podman_host() -> str:
    """Rootless podman's Docker-compatible API, run by an unprivileged user (see tests/podman_service.py)."""
    from podman_service import podman_service

    yield from podman_service()
