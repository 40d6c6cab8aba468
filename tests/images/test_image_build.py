"""`tracetap image build` and task images against the private dockerd (docker marker; warm cache is fast)."""

from __future__ import annotations

from pathlib import Path

import pytest
from docker_daemon import image_tag
from tracetap.rollout.images.daemon import ImageError, connect
from tracetap.rollout.images.task import build_task_image

pytestmark = pytest.mark.docker


def test_base_image_is_tagged_cached_and_runs_the_clis(image_build, docker_host: str) -> None:
    first = image_build("--harness", "claude_code", "--harness", "pi")
    assert first.returncode == 0, first.stderr
    tag = first.stdout.strip().splitlines()[-1]
    assert tag.startswith("tracetap-base:")
    second = image_build("--harness", "pi", "--harness", "claude-code")
    assert second.stdout.strip().splitlines()[-1] == tag and "cached" in second.stderr
    client = connect(docker_host)
    out = client.containers.run(tag, ["bash", "-lc", "claude --version && pi --version 2>&1"], remove=True,
                                network_mode="none")
    assert b"Claude Code" in out


def test_failing_dockerfile_is_a_clear_error(image_build, docker_host: str, tmp_path: Path) -> None:
    base = image_tag(image_build("--harness", "pi"))
    (tmp_path / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo broken-step && exit 3\n")
    with pytest.raises(ImageError, match="broken-step") as error:
        build_task_image(tmp_path, base, connect(docker_host))
    assert "failed" in str(error.value)
