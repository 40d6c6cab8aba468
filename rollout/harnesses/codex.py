"""`codex`: the Codex CLI (`codex exec`), OpenAI Responses through the gateway.

`$CODEX_HOME/config.toml` names a `tracetap` provider at the session's base URL with the session id as
its key (`OPENAI_API_KEY`); `--model` pins the model (a provider prefix such as `openai/` is dropped).
Settings: reasoning_effort (`-c model_reasoning_effort=`), extra_flags. Its session files are copied to
logs/agent after the run.
"""

from __future__ import annotations

from typing import Any

from tracetap.rollout.harnesses.base import HarnessContext, base_url
from tracetap.rollout.harnesses.cli import CliHarness
from tracetap.rollout.harnesses.settings import CliSettings


class Codex(CliHarness):
    name = "codex"
    api = "openai_responses"
    package = "@openai/codex"
    binary = "codex"
    shell_tool = "exec_command"
    log_file = "codex.txt"
    supports = frozenset({"reasoning_effort", "extra_flags"})
    transcripts = "$CODEX_HOME/sessions"

    def model(self, ctx: HarnessContext) -> str:
        return super().model(ctx).rpartition("/")[2]

    def files(self, ctx: HarnessContext) -> dict[str, str]:
        model = self.model(ctx)
        config = [f'model = "{model}"', f'review_model = "{model}"']
        if ctx.via_proxy:  # the built-in provider, at its own host
            config += ['model_provider = "openai"', 'preferred_auth_method = "apikey"']
        else:
            config += ['model_provider = "tracetap"', "[model_providers.tracetap]", 'name = "tracetap gateway"',
                       f'base_url = "{base_url(ctx)}/v1"', 'env_key = "OPENAI_API_KEY"',
                       'wire_api = "responses"']
        return {f"{self._home(ctx)}/config.toml": "\n".join([*config, ""])}

    def cli_env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"CODEX_HOME": self._home(ctx)}

    def flags(self, ctx: HarnessContext, settings: CliSettings) -> list[str]:
        flags = ["exec", "--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check", "--json",
                 "--model", self.model(ctx)]
        return flags + (["-c", f"model_reasoning_effort={settings.reasoning_effort}"]
                        if settings.reasoning_effort else [])

    def shell_arguments(self, command: str) -> dict[str, Any]:
        return {"cmd": command}

    @staticmethod
    def _home(ctx: HarnessContext) -> str:
        return f"{ctx.layout.home}/.codex"
