"""`shell`: a custom command (`agent.settings.command`) run with `bash -lc` in the session's workspace.

The command sees the gateway env (base URLs, the session key as every API key) plus `$INSTRUCTION`, and
`$MODEL` when the task names a model, so any script or CLI can be a harness.
"""

from __future__ import annotations

from tracetap.rollout.harnesses.base import HarnessContext, Step


class ShellCommand:
    name = "shell"
    api = "openai_chat"

    def files(self, ctx: HarnessContext) -> dict[str, str]:
        return {}

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"INSTRUCTION": ctx.instruction, **({"MODEL": ctx.model_name} if ctx.model_name else {})}

    def run_steps(self, ctx: HarnessContext) -> list[Step]:
        command = ctx.settings.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ValueError("the shell harness needs agent.settings.command (a shell command)")
        return [Step("shell", command)]

    def postrun_steps(self, ctx: HarnessContext) -> list[Step]:
        return []
