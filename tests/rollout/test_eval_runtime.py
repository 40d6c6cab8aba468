"""Evaluators get the runtime: the SWE-bench-format task set through a node with local runtimes.

The fresh evaluation runtime is started during RUN (ready before the agent ends), the agent's patch is
graded there, and an instance whose base commit does not exist ends in ERROR with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import PYTHON, run, samples, task
from swebench_set import make_task_set
from test_node import node_for, query, run_all
from tracetap.evaluators.swebench import TEST_COMMAND
from tracetap.rollout.models import SessionStatus
from tracetap.rollout.swebench import checkout_command
from tracetap.rollout.task_files import load_task

from tracetap.cli import cli

REPO = "testbed"  # relative: in each runtime's workspace
# the agent waits until its fresh evaluation runtime is prepared, so `eval_runtime_ready < run_end` holds
WAIT_FOR_EVAL = 'until [ -e "$SESSION_DIR-eval/logs/prepare.02.stdout.log" ]; do sleep 0.1; done; sleep 0.5; '


@pytest.fixture(scope="module")
def task_set(tmp_path_factory):
    return make_task_set(tmp_path_factory.mktemp("swebench-set"))


def swebench_task(task_set, instance: dict, command: str):
    config = {"instance": instance, "repo_dir": REPO,
              "test_command": f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {PYTHON} -m {TEST_COMMAND}"}
    prepare = [{"type": "upload_dir", "source": str(task_set.context / "testbed"), "target": REPO},
               {"type": "exec", "command": checkout_command(instance["base_commit"], REPO)},
               {"type": "exec", "command": 'echo "$SESSION_DIR" > "$ARTIFACTS_DIR/session_dir"'}]
    return task(task_id=instance["instance_id"], timeout_seconds=120, runtime={"prepare": prepare},
                agent={"harness": "shell", "settings": {"command": f"cd {REPO} && {command}"}},
                evaluator={"name": "swebench", "config": config})


def report(tmp_path: Path, sid: str) -> dict:
    [(_, value)] = json.loads((tmp_path / "sessions" / sid / "logs" / "eval" / "report.json").read_text()).items()
    return value


def test_three_instances_graded_in_a_fresh_runtime_and_a_missing_base_commit_is_an_error(gw, task_set, tmp_path):
    by_id = {i["instance_id"]: i for i in task_set.instances}
    broken = {**by_id["calc-add"], "instance_id": "calc-nobase", "base_commit": "0" * 40}
    requests = [swebench_task(task_set, by_id[name], WAIT_FOR_EVAL + task_set.agent_commands[name])
                for name in ("calc-add", "calc-mul", "calc-sub")]
    requests.append(swebench_task(task_set, broken, task_set.agent_commands["calc-add"]))
    contexts = [samples(request)[0] for request in requests]
    results = run(run_all(node_for(gw, tmp_path, run_workers=4, init_workers=4), contexts))
    resolved, broke, empty, nobase = results

    assert [r.status for r in results[:3]] == [SessionStatus.COMPLETED] * 3, [r.error for r in results]
    assert [r.reward for r in results[:3]] == [1.0, 0.0, 0.0]
    for result in results[:3]:
        line = result.timeline
        assert line["run_start"] <= line["eval_runtime_start"] < line["eval_runtime_ready"] < line["run_end"]

    for sid in (resolved.session_id, resolved.session_id + "-eval"):  # each runtime's env names its own folders
        assert (tmp_path / "sessions" / sid / "artifacts" / "session_dir").read_text().strip() == str(
            (tmp_path / "sessions" / sid).resolve())
    first = report(tmp_path, resolved.session_id)
    assert first["resolved"] and first["resolution"] == "RESOLVED_FULL"
    assert first["apply_command"] == "git apply --verbose"
    assert first["excluded_paths"] and all("__pycache__" in path for path in first["excluded_paths"])
    patch = (tmp_path / "sessions" / resolved.session_id / "logs" / "eval" / "patch.diff").read_text()
    assert "+    return a + b" in patch and "__pycache__" not in patch
    assert "PASSED tests/test_calc.py::test_add" in (
        tmp_path / "sessions" / resolved.session_id / "logs" / "eval" / "test_output.txt").read_text()

    second = report(tmp_path, broke.session_id)
    assert not second["resolved"] and second["resolution"] == "RESOLVED_NO"
    assert second["tests_status"]["FAIL_TO_PASS"] == {"success": ["tests/test_calc.py::test_mul"], "failure": []}
    assert second["tests_status"]["PASS_TO_PASS"]["failure"] == ["tests/test_calc.py::test_neg"]

    third = report(tmp_path, empty.session_id)
    assert third["empty_generation"] and not third["patch_exists"] and "tests_status" not in third
    stored = query(gw.store, "SELECT reward, details_json FROM rewards WHERE session_id = ?", [empty.session_id])
    assert stored[0][0] == 0.0 and json.loads(stored[0][1])["reason"] == "the agent's patch is empty"

    assert nobase.status is SessionStatus.ERROR
    assert f"base_commit {'0' * 40} does not exist in {REPO}" in nobase.error
    assert "eval_runtime_start" not in nobase.timeline and "run_start" not in nobase.timeline


def test_cli_writes_a_task_file_per_instance_and_refuses_bad_input(task_set, tmp_path):
    instances = task_set.context.parent / "instances.jsonl"
    made = CliRunner().invoke(cli, ["task", "swebench", str(instances), "--image", "tracetap-task:abc",
                                    "--setting", "command=true", "--out-dir", str(tmp_path / "tasks")])
    assert made.exit_code == 0, made.output
    paths = made.output.split()
    assert [Path(p).name for p in paths] == ["calc-add.json", "calc-mul.json", "calc-sub.json"]
    request = load_task(Path(paths[0]))
    assert request.evaluator.name == "swebench" and request.runtime.workdir == "/testbed"
    assert request.evaluator.config["instance"]["base_commit"] == task_set.instances[0]["base_commit"]
    assert request.agent.settings == {"command": "true"}

    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"instance_id": "x", "repo": "r"}) + "\n")
    refused = CliRunner().invoke(cli, ["task", "swebench", str(broken), "--image", "t:x", "--out-dir",
                                       str(tmp_path / "none")])
    assert refused.exit_code == 1 and "lacks base_commit" in refused.output
    assert not (tmp_path / "none").exists()

    harbor_dir = tmp_path / "harbor-task"
    (harbor_dir / "tests").mkdir(parents=True)
    (harbor_dir / "instruction.md").write_text("x")
    (harbor_dir / "task.toml").write_text("")
    refused = CliRunner().invoke(cli, ["task", "harbor", str(harbor_dir), "--base-image", "t:x"])
    assert refused.exit_code == 1 and "has no test.sh" in refused.output
