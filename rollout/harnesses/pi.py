"""`pi`: the pi coding agent (`pi --print`), Chat Completions through the gateway.

`~/.pi/agent/models.json` defines the provider of `model_name` (`provider/model`; a bare name uses the
provider `tracetap`) at the session's base URL with the session id as its key, and only that model.
Settings: reasoning_effort (`--thinking`), extra_flags. Runs with `--no-session`: it keeps no transcript.
"""

from __future__ import annotations

import json

from tracetap.rollout.harnesses.base import HarnessContext, base_url
from tracetap.rollout.harnesses.cli import CliHarness
from tracetap.rollout.harnesses.settings import CliSettings

DEFAULT_PROVIDER = "tracetap"
COMPAT = {"supportsDeveloperRole": False, "supportsReasoningEffort": False, "supportsStore": False,
          "maxTokensField": "max_tokens"}
CONTEXT_WINDOW, MAX_TOKENS = 262144, 8192


class Pi(CliHarness):
    name = "pi"
    api = "openai_chat"
    package = "@mariozechner/pi-coding-agent"
    binary = "pi"
    shell_tool = "bash"
    log_file = "pi.txt"
    supports = frozenset({"reasoning_effort", "extra_flags"})
    proxy_model = "openai/gpt-4.1"

    def provider_model(self, ctx: HarnessContext) -> tuple[str, str]:
        provider, _, model = self.model(ctx).rpartition("/")
        return provider or DEFAULT_PROVIDER, model

    def files(self, ctx: HarnessContext) -> dict[str, str]:
        if ctx.via_proxy:
            return {}  # the built-in provider of `proxy_model`
        provider, model = self.provider_model(ctx)
        entry = {"baseUrl": f"{base_url(ctx)}/v1", "api": "openai-completions", "apiKey": ctx.session_key,
                 "compat": COMPAT,
                 "models": [{"id": model, "contextWindow": CONTEXT_WINDOW, "maxTokens": MAX_TOKENS}]}
        return {f"{ctx.layout.home}/.pi/agent/models.json": json.dumps({"providers": {provider: entry}}, indent=2)}

    def cli_env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"PI_OFFLINE": "1"}

    def flags(self, ctx: HarnessContext, settings: CliSettings) -> list[str]:
        provider, model = self.provider_model(ctx)
        flags = ["--print", "--mode", "json", "--no-session", "--provider", provider, "--model", model]
        return flags + (["--thinking", settings.reasoning_effort] if settings.reasoning_effort else [])

    def prompt_args(self, instruction: str) -> list[str]:
        return [instruction]
