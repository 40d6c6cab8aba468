"""`qwen_code`: Qwen Code (`qwen --yolo`), Chat Completions through the gateway.

The model is pinned through `OPENAI_MODEL` only (passing `--model` as well conflicts); base URL and key
come from the gateway env. Settings: max_turns (`--max-session-turns`), extra_flags.
"""

from __future__ import annotations

from typing import Any

from tracetap.rollout.harnesses.base import HarnessContext
from tracetap.rollout.harnesses.cli import CliHarness
from tracetap.rollout.harnesses.settings import CliSettings


class QwenCode(CliHarness):
    name = "qwen_code"
    api = "openai_chat"
    package = "@qwen-code/qwen-code@latest"
    binary = "qwen"
    shell_tool = "run_shell_command"
    log_file = "qwen-code.txt"
    supports = frozenset({"max_turns", "extra_flags"})
    transcripts = "$HOME/.qwen/projects"

    def cli_env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"OPENAI_MODEL": self.model(ctx), "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}

    def flags(self, ctx: HarnessContext, settings: CliSettings) -> list[str]:
        flags = ["--auth-type", "openai", "--yolo"]
        return flags + (["--max-session-turns", str(settings.max_turns)] if settings.max_turns else [])

    def prompt_args(self, instruction: str) -> list[str]:
        return [f"--prompt={instruction}"]  # it reads no positional prompt after `--`

    def shell_arguments(self, command: str) -> dict[str, Any]:
        return {"command": command, "is_background": False}
