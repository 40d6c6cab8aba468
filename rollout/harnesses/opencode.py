"""`opencode`: opencode (`opencode run`), Chat Completions through the gateway.

`~/.config/opencode/opencode.json` defines a `tracetap` provider at `$OPENAI_BASE_URL` with
`$OPENAI_API_KEY` as its key (the gateway env: the session's base URL and id), pins `model` and
`small_model` (titles, summaries) to the task's model, and allows every tool. opencode sends its own
`x-session-id`; the session id as API key wins (DESIGN §4) and its id is kept as call metadata.
Settings: reasoning_effort (`--variant`), extra_flags.
"""

from __future__ import annotations

import json
from typing import Any

from tracetap.rollout.harnesses.base import HarnessContext
from tracetap.rollout.harnesses.cli import CliHarness
from tracetap.rollout.harnesses.settings import CliSettings

PROVIDER = "tracetap"
PERMISSIONS = ("read", "edit", "glob", "grep", "list", "bash", "task", "skill", "lsp", "question", "webfetch",
               "websearch", "codesearch", "external_directory", "doom_loop")


class Opencode(CliHarness):
    name = "opencode"
    api = "openai_chat"
    package = "opencode-ai"
    binary = "opencode"
    shell_tool = "bash"
    log_file = "opencode.txt"
    supports = frozenset({"reasoning_effort", "extra_flags"})
    proxy_model = "openai/gpt-4.1"  # through the proxy: a model of opencode's own catalog, at its own host
    transcripts = "$HOME/.local/share/opencode/log"

    def files(self, ctx: HarnessContext) -> dict[str, str]:
        config: dict[str, Any] = {"$schema": "https://opencode.ai/config.json", "model": self._qualified(ctx),
                                  "small_model": self._qualified(ctx),
                                  "permission": dict.fromkeys(PERMISSIONS, "allow")}
        if not ctx.via_proxy:
            config["provider"] = {PROVIDER: {
                "npm": "@ai-sdk/openai-compatible", "name": "tracetap gateway", "models": {self.model(ctx): {}},
                "options": {"baseURL": "{env:OPENAI_BASE_URL}", "apiKey": "{env:OPENAI_API_KEY}"}}}
        return {f"{ctx.layout.home}/.config/opencode/opencode.json": json.dumps(config, indent=2)}

    def _qualified(self, ctx: HarnessContext) -> str:
        """`provider/model`: through the proxy the model names its built-in provider, else ours."""
        return self.model(ctx) if ctx.via_proxy else f"{PROVIDER}/{self.model(ctx)}"

    def cli_env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_FAKE_VCS": "git"}

    def flags(self, ctx: HarnessContext, settings: CliSettings) -> list[str]:
        flags = ["run", "-m", self._qualified(ctx), "--format=json"]
        return flags + (["--variant", settings.reasoning_effort] if settings.reasoning_effort else [])

    def shell_arguments(self, command: str) -> dict[str, Any]:
        return {"command": command, "description": "Run the command"}
