"""The six CLI presets without npm: their config files, env, flags and settings, and their steps run for real
in the local runtime against a stand-in CLI (exit codes, the tee into logs/agent, transcripts kept).

The real CLIs run in tests/rollout/test_cli_sessions.py (pi, claude_code) and the harness tier (all six).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shlex
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError
from tracetap.engine.script import Script
from tracetap.rollout.harnesses import ALIASES, CLI_HARNESSES, cli_harness, npm
from tracetap.rollout.harnesses.base import HarnessContext, gateway_env
from tracetap.rollout.harnesses.script import SIDE_REPLY, write_script
from tracetap.rollout.models import TaskRequest
from tracetap.rollout.runtimes.local import LocalRuntime

GATEWAY = "http://127.0.0.1:9"
SID = "ses-unit-1"
KEY = "sk-tapkey-" + "u" * 43
NAMES = list(CLI_HARNESSES)


def context(runtime_root: Path, model: str | None = None, **settings) -> HarnessContext:
    runtime = LocalRuntime(runtime_root, SID)
    return HarnessContext(session_id=SID, session_key=KEY, task_id="t", instruction="Fix the tests, please.",
                          gateway_url=GATEWAY, layout=runtime.layout, model_name=model, settings=settings)


def parsed(path: str, text: str) -> object:
    return tomllib.loads(text) if path.endswith(".toml") else json.loads(text)


def everything(name: str, ctx: HarnessContext) -> str:
    """What the preset hands the runtime: files, env on top of the gateway env, and its commands."""
    preset = CLI_HARNESSES[name]
    files = preset.files(ctx)
    for path, text in files.items():
        parsed(path, text)  # each config is valid in its format
        assert path.startswith(ctx.layout.home + "/")  # only under the session's private HOME
    steps = preset.run_steps(ctx) + preset.postrun_steps(ctx)
    env = {**gateway_env(ctx), **preset.env(ctx)}
    return "\n".join([*files.values(), json.dumps(env), *(step.command for step in steps)])


@pytest.mark.parametrize("name", NAMES)
def test_each_preset_points_its_cli_at_the_session(name, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-secret")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-real-secret")
    ctx = context(tmp_path)
    text = everything(name, ctx)
    assert GATEWAY in text and KEY in text  # the gateway and the session's key
    assert "sk-real-secret" not in text
    assert f"$AGENT_LOG_DIR/{CLI_HARNESSES[name].log_file}" in text


@pytest.mark.parametrize("name", NAMES)
def test_the_model_is_pinned_everywhere(name, tmp_path):
    preset = CLI_HARNESSES[name]
    ctx = context(tmp_path, model="tracetap/my-model-7")
    text = everything(name, ctx)
    assert "my-model-7" in text
    assert preset.default_model not in text  # no tier or side model left on a default


def test_claude_code_pins_every_tier_and_the_subagent_model(tmp_path):
    env = CLI_HARNESSES["claude_code"].env(context(tmp_path, model="m1"))
    tiers = {key: value for key, value in env.items() if key.endswith("_MODEL")}
    assert tiers == dict.fromkeys(["ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                                   "ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL"], "m1")


@pytest.mark.parametrize(("name", "settings", "flags"), [
    ("claude_code", {"max_turns": 3, "reasoning_effort": "high"}, ["--max-turns", "3", "--effort", "high"]),
    ("codex", {"reasoning_effort": "low"}, ["-c", "model_reasoning_effort=low"]),
    ("qwen_code", {"max_turns": 4}, ["--max-session-turns", "4"]),
    ("opencode", {"reasoning_effort": "max"}, ["--variant", "max"]),
    ("pi", {"reasoning_effort": "minimal", "extra_flags": "--tools 'read,bash'"},
     ["--thinking", "minimal", "--tools", "read,bash"]),
    ("gemini_cli", {"extra_flags": ["--sandbox"]}, ["--sandbox"]),
])
def test_settings_become_flags_before_the_prompt(name, settings, flags, tmp_path):
    preset = CLI_HARNESSES[name]
    ctx = context(tmp_path, **settings)
    (step,) = preset.run_steps(ctx)
    argv = shlex.split(step.command.split(";")[2].split(" </dev/null")[0])
    at = next(i for i in range(len(argv)) if argv[i:i + len(flags)] == flags)
    assert any(arg.endswith("Fix the tests, please.") for arg in argv[at + len(flags):])  # the prompt is last


def test_gemini_max_turns_goes_to_its_settings_file(tmp_path):
    (text,) = CLI_HARNESSES["gemini_cli"].files(context(tmp_path, max_turns=5)).values()
    assert json.loads(text)["model"]["maxSessionTurns"] == 5


@pytest.mark.parametrize(("name", "settings", "message"), [
    ("codex", {"max_turns": 3}, r"agent.settings.max_turns is not supported by codex"),
    ("pi", {"temperature": 0.2}, r"agent.settings.temperature is not supported by pi"),
    ("claude_code", {"max_turns": 0}, r"max_turns must be a positive integer"),
    ("claude_code", {"max_turns": True}, r"max_turns must be a positive integer"),
    ("opencode", {"reasoning_effort": ""}, r"reasoning_effort must be a word"),
    ("qwen_code", {"extra_flags": [1]}, r"extra_flags must be a string or a list of strings"),
])
def test_a_setting_the_cli_cannot_honour_is_an_error(name, settings, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        CLI_HARNESSES[name].run_steps(context(tmp_path, **settings))


def test_a_task_asking_for_an_unsupported_setting_is_refused_at_submit():
    with pytest.raises(ValidationError, match=r"agent\n.*max_turns is not supported by codex"):
        TaskRequest(task_id="t", instruction="x", agent={"harness": "codex", "settings": {"max_turns": 3}})


def test_presets_are_registered_for_tasks_and_old_names_still_resolve():
    for name in NAMES:
        assert TaskRequest(task_id="t", instruction="x", agent={"harness": name}).agent.harness == name
    assert ALIASES == {"claude-code": "claude_code", "gemini-cli": "gemini_cli", "qwen-code": "qwen_code"}
    assert cli_harness("qwen-code") is CLI_HARNESSES["qwen_code"]


def test_script_keeps_side_calls_off_the_main_loop(tmp_path):
    path = write_script(tmp_path / "s.jsonl", CLI_HARNESSES["codex"], ["ls", "echo hi"], "Finished.")
    script = Script.load(path)
    assert script.next_reply("s", has_tools=True)["tool_calls"][0]["function"] == {
        "name": "exec_command", "arguments": {"cmd": "ls"}}
    assert script.next_reply("s", has_tools=False)["content"] == SIDE_REPLY  # e.g. a title call
    assert script.next_reply("s", has_tools=True)["tool_calls"][0]["function"]["arguments"] == {"cmd": "echo hi"}
    assert [script.next_reply("s", has_tools=True)["content"] for _ in range(2)] == ["Finished."] * 2


def fake_cli(prefix: Path, name: str, body: str) -> Path:
    path = npm.bin_dir(prefix) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_binaries_come_from_the_npm_prefix_else_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    pi = fake_cli(tmp_path / "npm", "pi", "exit 0")
    assert npm.require_binary(CLI_HARNESSES["pi"], tmp_path / "npm") == pi
    npm.install([CLI_HARNESSES["pi"]], tmp_path / "npm")  # installed already: npm is not needed
    with pytest.raises(npm.HarnessError, match=r"npm install --prefix \S+ .*@openai/codex"):
        npm.require_binary(CLI_HARNESSES["codex"], tmp_path / "npm")


def run_steps(name: str, ctx: HarnessContext, runtime: LocalRuntime, steps) -> list:
    async def scenario():
        await runtime.start()
        env = {**gateway_env(ctx), **CLI_HARNESSES[name].env(ctx)}
        for target, text in CLI_HARNESSES[name].files(ctx).items():
            await runtime.write_text(target, text)
        try:
            return [await runtime.exec(step.command, env=env, log_name=f"agent/{step.name}", timeout=30)
                    for step in steps]
        finally:
            await runtime.teardown()
    return asyncio.run(scenario())


def test_the_run_step_tees_the_cli_output_and_keeps_its_exit_code(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACETAP_NPM_DIR", str(tmp_path / "npm"))
    fake_cli(tmp_path / "npm", "pi", 'echo "home=$HOME key=$OPENAI_API_KEY"; echo "args: $*"; echo oops >&2; exit 3')
    runtime = LocalRuntime(tmp_path / "sessions", SID)
    ctx = context(tmp_path / "sessions")
    (result,) = run_steps("pi", ctx, runtime, CLI_HARNESSES["pi"].run_steps(ctx))
    assert result.returncode == 3  # through the pipe into tee
    tee = Path(ctx.layout.agent_logs, "pi.txt").read_text()
    assert tee == result.stdout_path.read_text()
    lines = tee.splitlines()
    assert lines[0] == f"home={ctx.layout.home} key={KEY}" and lines[-1] == "oops"
    assert lines[1].startswith("args: --print --mode json --no-session") and lines[1].endswith("Fix the tests, please.")


def test_codex_transcripts_are_copied_to_the_agent_logs(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACETAP_NPM_DIR", str(tmp_path / "npm"))
    fake_cli(tmp_path / "npm", "codex",
             'mkdir -p "$CODEX_HOME/sessions/2026" && echo "{}" > "$CODEX_HOME/sessions/2026/r.jsonl"')
    runtime = LocalRuntime(tmp_path / "sessions", SID)
    ctx = context(tmp_path / "sessions")
    preset = CLI_HARNESSES["codex"]
    results = run_steps("codex", ctx, runtime, preset.run_steps(ctx) + preset.postrun_steps(ctx))
    assert [r.returncode for r in results] == [0, 0]
    assert Path(ctx.layout.agent_logs, "codex-sessions", "2026", "r.jsonl").read_text() == "{}\n"
    assert "[model_providers.tracetap]" in Path(ctx.layout.home, ".codex", "config.toml").read_text()


def test_demo_without_the_cli_says_how_to_install_it(tmp_path):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "keep.txt").write_text("untouched")
    env = {**os.environ, "TRACETAP_NPM_DIR": str(tmp_path / "npm"), "PATH": str(tmp_path / "empty")}
    done = subprocess.run([sys.executable, "-m", "tracetap.cli", "demo", "--harness", "gemini-cli",
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "`gemini` is not installed" in done.stderr and "@google/gemini-cli" in done.stderr
    assert (out / "keep.txt").read_text() == "untouched"  # checked before the folder is replaced


@pytest.mark.parametrize("name", NAMES)
def test_in_a_container_the_cli_is_the_images_command(name, tmp_path):
    """Host npm paths mean nothing inside a container: the image puts each CLI on PATH."""
    preset = CLI_HARNESSES[name]
    (step,) = preset.run_steps(dataclasses.replace(context(tmp_path), contained=True))
    assert shlex.split(step.command.split(";")[2].split(" </dev/null")[0])[0] == preset.binary
