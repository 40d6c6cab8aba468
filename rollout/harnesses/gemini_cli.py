"""`gemini_cli`: Gemini CLI (`gemini --prompt`), generateContent through the gateway.

`~/.gemini/settings.json` selects API-key auth, pins the model and turns telemetry off; the base URL and
key come from the gateway env (`GOOGLE_GEMINI_BASE_URL`, `GEMINI_API_KEY`). Settings: max_turns
(`model.maxSessionTurns`), extra_flags.
"""

from __future__ import annotations

import json
from typing import Any

from tracetap.rollout.harnesses.base import HarnessContext
from tracetap.rollout.harnesses.cli import CliHarness
from tracetap.rollout.harnesses.settings import CliSettings


class GeminiCli(CliHarness):
    name = "gemini_cli"
    api = "gemini"
    package = "@google/gemini-cli"
    binary = "gemini"
    shell_tool = "run_shell_command"
    log_file = "gemini-cli.txt"
    supports = frozenset({"max_turns", "extra_flags"})
    default_model = "gemini-2.5-flash"  # the CLI checks model names against its own list
    transcripts = "$HOME/.gemini/tmp"

    def files(self, ctx: HarnessContext) -> dict[str, str]:
        model: dict[str, Any] = {"name": self.model(ctx)}
        if (turns := self.settings(ctx).max_turns) is not None:
            model["maxSessionTurns"] = turns
        settings = {"security": {"auth": {"selectedType": "gemini-api-key"}}, "model": model,
                    "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}}
        return {f"{ctx.layout.home}/.gemini/settings.json": json.dumps(settings, indent=2)}

    def cli_env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"GEMINI_CLI_TRUST_WORKSPACE": "true"}

    def flags(self, ctx: HarnessContext, settings: CliSettings) -> list[str]:
        return ["--approval-mode=yolo", "--model", self.model(ctx)]

    def prompt_args(self, instruction: str) -> list[str]:
        return [f"--prompt={instruction}"]

    def shell_arguments(self, command: str) -> dict[str, Any]:
        return {"command": command, "description": "Run the command"}
