"""Harness presets by name (`AgentSpec.harness`).

`CLI_HARNESSES` are the six npm coding-agent CLIs; `ALIASES` keeps the hyphenated names the one-shot
presets had (`claude-code`, ...) working where a user types a name.
"""

from __future__ import annotations

from tracetap.rollout.harnesses.base import Harness
from tracetap.rollout.harnesses.builtin import BuiltinAgent
from tracetap.rollout.harnesses.claude_code import ClaudeCode
from tracetap.rollout.harnesses.cli import CliHarness
from tracetap.rollout.harnesses.codex import Codex
from tracetap.rollout.harnesses.gemini_cli import GeminiCli
from tracetap.rollout.harnesses.opencode import Opencode
from tracetap.rollout.harnesses.pi import Pi
from tracetap.rollout.harnesses.qwen_code import QwenCode
from tracetap.rollout.harnesses.shell import ShellCommand

CLI_HARNESSES: dict[str, CliHarness] = {
    preset.name: preset for preset in (ClaudeCode(), Codex(), GeminiCli(), QwenCode(), Opencode(), Pi())}
ALIASES = {name.replace("_", "-"): name for name in CLI_HARNESSES if "_" in name}
HARNESSES: dict[str, Harness] = {preset.name: preset for preset in (BuiltinAgent(), ShellCommand())}
HARNESSES.update(CLI_HARNESSES)


def cli_harness(name: str) -> CliHarness:
    """A CLI preset by its name or old hyphenated alias; KeyError when there is none."""
    return CLI_HARNESSES[ALIASES.get(name, name)]
