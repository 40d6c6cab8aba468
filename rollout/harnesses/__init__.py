"""Harness presets by name (`AgentSpec.harness`)."""

from __future__ import annotations

from tracetap.rollout.harnesses.base import Harness
from tracetap.rollout.harnesses.builtin import BuiltinAgent
from tracetap.rollout.harnesses.shell import ShellCommand

HARNESSES: dict[str, Harness] = {preset.name: preset for preset in (BuiltinAgent(), ShellCommand())}
