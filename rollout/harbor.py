"""Harbor task directories as TaskRequests: the task's image built here, its verifier as the evaluator.

A Harbor task is `instruction.md`, `task.toml`, `environment/Dockerfile` (or `[environment].docker_image`)
and `tests/test.sh`. The image is built locally with `build_task_image` (FROM the base image through the
`BASE_IMAGE` build arg); the session runs in it with the image's WORKDIR (or `[environment].workdir`) as its
working directory; the `harbor` evaluator uploads `tests/` after the agent finished and reads the reward.
Everything is checked before anything is built, so a bad task directory leaves nothing behind.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from tracetap.evaluators.harbor import DEFAULT_TIMEOUT, check_tests_dir
from tracetap.rollout.images.daemon import Log
from tracetap.rollout.images.task import build_task_image
from tracetap.rollout.models import TaskRequest

DEFAULT_AGENT_TIMEOUT = 600.0
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class HarborTaskError(ValueError):
    """A task directory that is not a usable Harbor task; the message names what is wrong."""


@dataclass(frozen=True)
class HarborTask:
    path: Path
    instruction: str
    config: dict[str, Any]  # task.toml

    def section(self, name: str) -> dict[str, Any]:
        value = self.config.get(name, {})
        if not isinstance(value, dict):
            raise HarborTaskError(f"{self.path}/task.toml: [{name}] must be a table")
        return value


def read_task(task_dir: Path | str) -> HarborTask:
    """The task's instruction and task.toml, after checking its layout (no Docker needed)."""
    path = Path(task_dir).resolve()
    for name in ("instruction.md", "task.toml"):
        if not (path / name).is_file():
            raise HarborTaskError(f"{path}: no {name} (not a Harbor task directory)")
    try:
        check_tests_dir(path / "tests")
    except ValueError as exc:
        raise HarborTaskError(str(exc)) from None
    try:
        config = tomllib.loads((path / "task.toml").read_text())
    except tomllib.TOMLDecodeError as exc:
        raise HarborTaskError(f"{path}/task.toml: {exc}") from None
    task = HarborTask(path, (path / "instruction.md").read_text(), config)
    if not task.section("environment").get("docker_image") and not (path / "environment" / "Dockerfile").is_file():
        raise HarborTaskError(f"{path}: no environment/Dockerfile and no [environment].docker_image")
    return task


def expand(value: str) -> str:
    """Harbor's `${VAR}` / `${VAR:-default}` expansion of env values, from this process's environment."""
    return _VARIABLE.sub(lambda m: os.environ.get(m.group(1), m.group(2) or ""), value)


def task_image(task: HarborTask, base_image: str, client: docker.DockerClient, log: Log | None = None) -> str:
    """The task's `docker_image` when it names one, else its environment built on `base_image`."""
    named = task.section("environment").get("docker_image")
    return named if named else build_task_image(task.path / "environment", base_image, client, log)


def _workdir(task: HarborTask, image: str, client: docker.DockerClient) -> str | None:
    return task.section("environment").get("workdir") or client.images.get(image).attrs["Config"].get("WorkingDir") \
        or None


def _runtime(task: HarborTask, image: str, client: docker.DockerClient) -> dict[str, Any]:
    env = task.section("environment")
    limits = {key: env[key] for key in ("cpus", "memory_mb") if env.get(key)}
    return {"backend": "docker", "image": image, "workdir": _workdir(task, image, client),
            "env": {name: expand(str(value)) for name, value in env.get("env", {}).items()}, **limits}


def _evaluator(task: HarborTask) -> dict[str, Any]:
    verifier = task.section("verifier")
    return {"name": "harbor", "config": {
        "tests_dir": str(task.path / "tests"), "timeout": float(verifier.get("timeout_sec", DEFAULT_TIMEOUT)),
        "env": {name: expand(str(value)) for name, value in verifier.get("env", {}).items()}}}


def harbor_task_request(task_dir: Path | str, *, base_image: str, agent: dict[str, Any],
                        client: docker.DockerClient, log: Log | None = None, **fields: Any) -> TaskRequest:
    """A TaskRequest for the Harbor task in `task_dir`, its image built on `base_image` if need be.

    `agent` is the AgentSpec (harness, settings, ...); `fields` override TaskRequest fields (task_id,
    num_samples, timeout_seconds, callback_url, ...). The default budget is the agent's plus the verifier's.
    """
    task = read_task(task_dir)
    image = task_image(task, base_image, client, log)
    evaluator = _evaluator(task)
    budget = float(task.section("agent").get("timeout_sec") or DEFAULT_AGENT_TIMEOUT) + evaluator["config"]["timeout"]
    body = {"task_id": task.path.name, "instruction": task.instruction, "timeout_seconds": budget,
            "agent": agent, "runtime": _runtime(task, image, client), "evaluator": evaluator,
            "metadata": {"harbor_task": str(task.path), **({"name": n} if (n := task.section("task").get("name"))
                                                            else {})}}
    return TaskRequest.model_validate({**body, **fields})
