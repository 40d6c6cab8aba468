"""SWE-bench-format instances as TaskRequests: the repository at `base_commit`, graded by `swebench`.

The image must hold the instance's repository (with its history) at `repo_dir` (`/testbed`, as SWE-bench
images do). A prepare step checks `base_commit` out (and says so plainly when the commit is not there); the
fresh evaluation runtime runs the same step, so the agent and the grader start from the same tree.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from tracetap.evaluators.swebench import DEFAULTS, check_instance
from tracetap.rollout.models import TaskRequest

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class InstanceFileError(ValueError):
    """A SWE-bench instances file that cannot be read."""


def load_instances(path: Path | str) -> list[dict[str, Any]]:
    """Instances from a JSONL file (one object a line) or a JSON list."""
    text = Path(path).read_text()
    try:
        if text.lstrip().startswith("["):
            return json.loads(text)
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise InstanceFileError(f"{path}: not JSONL or a JSON list of instances: {exc}") from None


def checkout_command(base_commit: str, repo_dir: str) -> str:
    """Check out `base_commit` in a clean tree; a commit the repository lacks is a one-line error."""
    base, repo, commit = shlex.quote(base_commit), shlex.quote(repo_dir), shlex.quote(base_commit + "^{commit}")
    missing = shlex.quote(f"base_commit {base_commit} does not exist in {repo_dir}")
    return (f"git -C {repo} cat-file -e {commit} 2>/dev/null || {{ echo {missing} >&2; exit 1; }}\n"
            f"git -C {repo} checkout -q -f {base} && git -C {repo} clean -q -fdx")


def task_id_for(instance_id: str) -> str:
    """A path-safe task id from an instance id (`owner__repo-1234` stays as it is)."""
    return _UNSAFE.sub("_", instance_id)[:128]


def swebench_task_request(instance: dict[str, Any], *, image: str, agent: dict[str, Any],
                          repo_dir: str = DEFAULTS["repo_dir"], **fields: Any) -> TaskRequest:
    """A TaskRequest running `agent` on the instance in `image`; `fields` override TaskRequest fields."""
    checked = check_instance(instance)
    prepare = [{"type": "exec", "command": checkout_command(checked["base_commit"], repo_dir)}]
    body = {"task_id": task_id_for(checked["instance_id"]),
            "instruction": checked.get("problem_statement") or f"Resolve {checked['instance_id']}.",
            "agent": agent, "runtime": {"backend": "docker", "image": image, "workdir": repo_dir, "prepare": prepare},
            "evaluator": {"name": "swebench", "config": {"instance": instance, "repo_dir": repo_dir}},
            "metadata": {"instance_id": checked["instance_id"], "repo": checked["repo"]}}
    return TaskRequest.model_validate({**body, **fields})
