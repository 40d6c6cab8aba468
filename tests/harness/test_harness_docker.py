"""All six CLIs in Docker: each runs from the image `tracetap image build` makes, on the node's gateway-only
network, and every call it makes lands token-faithful in its rollout session; no container is left."""

from __future__ import annotations

import cli_sessions
import docker
import pytest
from docker_daemon import image_tag
from tracetap.rollout.harnesses import CLI_HARNESSES

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def all_clis_image(image_build) -> str:
    return image_tag(image_build())  # every preset's CLI


@pytest.mark.parametrize("name", list(CLI_HARNESSES))
def test_every_cli_runs_in_a_container(name: str, all_clis_image: str, tmp_path) -> None:
    run = cli_sessions.run_cli_session(name, tmp_path, runtime={"backend": "docker", "image": all_clis_image})
    cli_sessions.check_session(run)
    client = docker.from_env()
    try:
        left = client.containers.list(all=True, filters={"label": f"tracetap.session={run.result.session_id}"})
    finally:
        client.close()
    assert left == []
