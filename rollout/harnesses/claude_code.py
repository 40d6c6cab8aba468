"""`claude_code`: Claude Code (`claude -p`), Anthropic Messages through the gateway.

Every model tier and the sub-agent model are pinned to the task's model, so no call is routed to a model
the gateway does not serve. Settings: max_turns (`--max-turns`), reasoning_effort (`--effort`), extra_flags.
"""

from __future__ import annotations

from typing import Any

from tracetap.rollout.harnesses.base import HarnessContext
from tracetap.rollout.harnesses.cli import CliHarness
from tracetap.rollout.harnesses.settings import CliSettings

MODEL_TIERS = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
               "ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")
MAX_OUTPUT_TOKENS = "8192"  # Claude Code asks for far more by default than a served context holds


class ClaudeCode(CliHarness):
    name = "claude_code"
    api = "anthropic_messages"
    package = "@anthropic-ai/claude-code@latest"
    binary = "claude"
    shell_tool = "Bash"
    log_file = "claude-code.txt"
    supports = frozenset({"max_turns", "reasoning_effort", "extra_flags"})
    transcripts = "$CLAUDE_CONFIG_DIR/projects"

    def cli_env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"CLAUDE_CONFIG_DIR": f"{ctx.layout.home}/.claude", "IS_SANDBOX": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": MAX_OUTPUT_TOKENS,
                **dict.fromkeys(MODEL_TIERS, self.model(ctx))}

    def flags(self, ctx: HarnessContext, settings: CliSettings) -> list[str]:
        flags = ["--verbose", "--output-format=stream-json", "--dangerously-skip-permissions",
                 "--model", self.model(ctx)]
        flags += ["--max-turns", str(settings.max_turns)] if settings.max_turns else []
        flags += ["--effort", settings.reasoning_effort] if settings.reasoning_effort else []
        return flags

    def prompt_args(self, instruction: str) -> list[str]:
        return ["-p", instruction]

    def shell_arguments(self, command: str) -> dict[str, Any]:
        return {"command": command, "description": "Run the command"}
