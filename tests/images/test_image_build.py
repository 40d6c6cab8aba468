"""`tracetap image build` and task images against the private dockerd (docker marker; warm cache is fast)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tracetap.rollout.images.base import images_dir
from tracetap.rollout.images.daemon import ImageError, connect
from tracetap.rollout.images.task import build_task_image

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
CACHE = images_dir()  # read at import: the images cache outlives a run (the session fixture moves TRACETAP_HOME)


def image_build(docker_host: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DOCKER_HOST": docker_host, "TRACETAP_IMAGES_DIR": str(CACHE)}
    return subprocess.run([sys.executable, "-m", "tracetap.cli", "image", "build", *args], env=env,
                          capture_output=True, text=True, timeout=1800)


def test_base_image_is_tagged_cached_and_runs_the_clis(docker_host: str) -> None:
    first = image_build(docker_host, "--harness", "claude_code", "--harness", "pi")
    assert first.returncode == 0, first.stderr
    tag = first.stdout.strip().splitlines()[-1]
    assert tag.startswith("tracetap-base:")
    second = image_build(docker_host, "--harness", "pi", "--harness", "claude-code")
    assert second.stdout.strip().splitlines()[-1] == tag and "cached" in second.stderr
    client = connect(docker_host)
    out = client.containers.run(tag, ["bash", "-lc", "claude --version && pi --version 2>&1"], remove=True,
                                network_mode="none")
    assert b"Claude Code" in out


def test_failing_dockerfile_is_a_clear_error(docker_host: str, tmp_path: Path) -> None:
    base = image_build(docker_host, "--harness", "pi").stdout.strip().splitlines()[-1]
    (tmp_path / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo broken-step && exit 3\n")
    with pytest.raises(ImageError, match="broken-step") as error:
        build_task_image(tmp_path, base, connect(docker_host))
    assert "failed" in str(error.value)
