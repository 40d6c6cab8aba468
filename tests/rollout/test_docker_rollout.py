"""Acceptance: claude_code from `tracetap image build` in Docker, 4 samples through the rollout server (the
harness tier runs the same for all six CLIs: tests/harness/test_harness_docker.py)."""

from __future__ import annotations

import cli_sessions
import pytest
from docker_daemon import image_tag

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def claude_image(image_build) -> str:
    return image_tag(image_build("--harness", "claude_code"))


def test_four_claude_code_samples_in_docker_end_rewarded_by_callback(claude_image: str, tmp_path) -> None:
    cli_sessions.four_samples_in_docker("claude_code", claude_image, tmp_path)
