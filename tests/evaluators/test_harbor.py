"""harbor: reward files read by current Harbor's rules, config checked before any session."""

from __future__ import annotations

from pathlib import Path

import pytest
from tracetap.evaluators.base import EvaluatorError, create
from tracetap.evaluators.harbor import parse_reward, primary
from tracetap.rollout.harbor import HarborTaskError, read_task


@pytest.mark.parametrize("name, text, rewards", [
    ("reward.json", '{"reward": 0.75, "style": 1}', {"reward": 0.75, "style": 1.0}),
    ("reward.json", '{"accuracy": 1}', {"accuracy": 1.0}),
    ("reward.txt", "1\n", {"reward": 1.0}),
    ("reward.txt", " 0.25 ", {"reward": 0.25}),
])
def test_reward_files_parse(name: str, text: str, rewards: dict) -> None:
    assert parse_reward(name, text) == rewards


@pytest.mark.parametrize("name, text, message", [
    ("reward.txt", "", "is empty"),
    ("reward.json", "  \n", "is empty"),
    ("reward.txt", "yes", "cannot parse"),
    ("reward.json", "{not json", "cannot parse"),
    ("reward.json", "1.0", "flat object"),
    ("reward.json", "{}", "flat object"),
    ("reward.json", '{"reward": {"nested": 1}}', "'reward' must be a finite number"),
    ("reward.json", '{"reward": true}', "'reward' must be a finite number"),
])
def test_bad_reward_files_are_errors_not_zeros(name: str, text: str, message: str) -> None:
    with pytest.raises(EvaluatorError, match=message):
        parse_reward(name, text)


def test_primary_reward_is_the_reward_key_or_the_only_one() -> None:
    assert primary({"style": 0.0, "reward": 1.0}) == 1.0
    assert primary({"accuracy": 0.5}) == 0.5
    with pytest.raises(EvaluatorError, match="none named 'reward'"):
        primary({"a": 1.0, "b": 0.0})


def harbor_dir(root: Path, with_test: bool = True) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "environment").mkdir()
    (root / "instruction.md").write_text("Say hello.\n")
    (root / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 30.0\n')
    (root / "environment" / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\n")
    if with_test:
        (root / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return root


def test_config_defaults_and_errors(tmp_path: Path) -> None:
    task = harbor_dir(tmp_path / "ok")
    config = create("harbor").check_config({"tests_dir": str(task / "tests")})
    assert config == {"tests_dir": str(task / "tests"), "timeout": 600.0, "env": {}, "cwd": None}
    for bad, message in (({}, "tests_dir"), ({"tests_dir": str(task / "tests"), "timeout": 0}, "positive"),
                         ({"tests_dir": str(task / "tests"), "extra": 1}, "unknown"),
                         ({"tests_dir": str(task / "tests"), "cwd": "app"}, "absolute")):
        with pytest.raises(EvaluatorError, match=message):
            create("harbor").check_config(bad)


def test_a_task_without_tests_test_sh_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    task = harbor_dir(tmp_path / "no-test", with_test=False)
    with pytest.raises(HarborTaskError, match="no test.sh"):
        read_task(task)
    with pytest.raises(EvaluatorError, match="no test.sh"):
        create("harbor").check_config({"tests_dir": str(task / "tests")})
    assert read_task(harbor_dir(tmp_path / "ok")).instruction == "Say hello.\n"
