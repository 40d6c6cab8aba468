"""The object-store tier: moto's S3-compatible server on loopback, run from its own virtualenv
(scripts/moto.sh: moto's pins conflict with the main venv's), reached with dummy credentials from the
environment, which every gateway and CLI process started here inherits."""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tracetap.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
KEY_ID = "tracetap-test-key-4f1c"
SECRET = "tracetap-test-secret-8d2e"


def _wait_ready(process: subprocess.Popen, endpoint: str, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(endpoint, timeout=2)
            return
        except httpx.TransportError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not start:\n{log.read_text()[-2000:]}") from None
            time.sleep(0.2)


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto_server on a free loopback port, with the AWS_* variables pointing at it; stopped by its pid."""
    server = subprocess.run(["bash", str(ROOT / "scripts" / "moto.sh")], capture_output=True, text=True,
                            check=True).stdout.strip()
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)], stdout=out,
                                   stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(process, endpoint, log)
        with pytest.MonkeyPatch.context() as env:
            for name, value in {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
                                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}.items():
                env.setenv(name, value)
            yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def s3_credentials() -> tuple[str, str]:
    """The dummy (key id, secret) every process here reaches the server with."""
    return KEY_ID, SECRET


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    """A new, empty bucket."""
    import fsspec

    name = f"tracetap-{secrets.token_hex(4)}"
    fsspec.filesystem("s3", skip_instance_cache=True).mkdir(name)
    return name
