"""What the six npm coding-agent presets share: one run step that tees the CLI's output to logs/agent.

A preset says how to configure its CLI (files under the session's HOME, env), its flags for a one-shot
run with the model pinned, and where the CLI keeps its own transcripts (copied to logs/agent after the
run). The gateway env (base URLs with the session's `/s/<id>/` prefix, the session id as every API key)
comes from `gateway_env`, so every call of the CLI and of its sub-agents lands in the rollout session.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from tracetap.rollout.harnesses.base import HarnessContext, Step
from tracetap.rollout.harnesses.npm import find_binary
from tracetap.rollout.harnesses.settings import CliSettings, parse_settings

DEFAULT_MODEL = "tracetap-model"  # the gateway maps any unknown name to the served model
# npm offline: a CLI that installs packages at run time (opencode's plugins) must not reach out.
QUIET_ENV = {"TERM": "dumb", "NO_COLOR": "1", "npm_config_offline": "true", "DISABLE_TELEMETRY": "1"}


class CliHarness(ABC):
    """Base of the CLI presets (implements `Harness`); subclasses fill in the class attributes."""

    name: str
    api: str
    package: str          # npm package spec
    binary: str           # its command
    shell_tool: str       # the name of the CLI's shell tool (a scripted engine asks for it)
    log_file: str         # logs/agent/<log_file>: the CLI's output
    supports: frozenset[str] = frozenset({"extra_flags"})
    default_model: str = DEFAULT_MODEL
    proxy_model: str | None = None  # the default through the proxy, when the CLI's own catalog must know it
    transcripts: str | None = None  # where the CLI writes its own session files (shell expression)

    def model(self, ctx: HarnessContext) -> str:
        return ctx.model_name or (ctx.via_proxy and self.proxy_model) or self.default_model

    def settings(self, ctx: HarnessContext) -> CliSettings:
        return self.check_settings(ctx.settings)

    def check_settings(self, settings: Mapping[str, Any]) -> CliSettings:
        """Raises ValueError naming a setting this CLI cannot honour or a mistyped one."""
        return parse_settings(self.name, settings, self.supports)

    def files(self, ctx: HarnessContext) -> dict[str, str]:
        return {}

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {**QUIET_ENV, "TMPDIR": f"{ctx.layout.root}/tmp", **self.cli_env(ctx)}

    def cli_env(self, ctx: HarnessContext) -> dict[str, str]:
        return {}

    @abstractmethod
    def flags(self, ctx: HarnessContext, settings: CliSettings) -> list[str]:
        """The CLI's arguments before the prompt: one-shot, no approvals, the model pinned."""

    def prompt_args(self, instruction: str) -> list[str]:
        return ["--", instruction]

    def executable(self, ctx: HarnessContext) -> str:
        """The npm prefix's binary when the CLI runs on this host and has it, else the bare command (PATH)."""
        found = None if ctx.contained else find_binary(self)
        return str(found) if found else self.binary

    def run_steps(self, ctx: HarnessContext) -> list[Step]:
        settings = self.settings(ctx)
        argv = [self.executable(ctx), *self.flags(ctx, settings), *settings.extra_flags,
                *self.prompt_args(ctx.instruction)]
        command = (f'set -o pipefail; mkdir -p "$TMPDIR"; {shlex.join(argv)} </dev/null 2>&1 '
                   f'| tee "$AGENT_LOG_DIR/{self.log_file}"')
        return [Step(self.name, command)]

    def postrun_steps(self, ctx: HarnessContext) -> list[Step]:
        if self.transcripts is None:
            return []
        target = f'"$AGENT_LOG_DIR/{self.name}-sessions"'
        return [Step("transcripts", f'if [ -d "{self.transcripts}" ]; then cp -r "{self.transcripts}" {target}; fi')]

    def shell_arguments(self, command: str) -> dict[str, Any]:
        """The arguments of a call to the shell tool that runs `command`."""
        return {"command": command}

    def shell_call(self, command: str) -> dict[str, Any]:
        """A scripted assistant message that asks this CLI to run `command` with its shell tool."""
        return {"content": None, "tool_calls": [
            {"function": {"name": self.shell_tool, "arguments": self.shell_arguments(command)}}]}
