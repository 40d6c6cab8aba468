"""All six CLIs in Docker: four samples of each through the rollout server, from the image `tracetap image
build` makes with every CLI, on the node's gateway-only network (cli_sessions.four_samples_in_docker)."""

from __future__ import annotations

import cli_sessions
import pytest
from docker_daemon import image_tag
from tracetap.rollout.harnesses import CLI_HARNESSES

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def all_clis_image(image_build) -> str:
    return image_tag(image_build())  # every preset's CLI


@pytest.mark.parametrize("name", list(CLI_HARNESSES))
def test_four_samples_of_every_cli_in_containers(name: str, all_clis_image: str, tmp_path) -> None:
    cli_sessions.four_samples_in_docker(name, all_clis_image, tmp_path)
