"""`builtin`: the demo agent (tracetap/agent.py) as a harness, run as `python -m tracetap.agent`.

It speaks Chat Completions through `$OPENAI_BASE_URL` with the session id as its key, so it needs no
config file. Settings: `max_turns` (default 12). On the local runtime it runs under the node's own Python;
in a container under the image's `python`, which must have the openai SDK and `tracetap.agent` (the image
`rollout/images/agent.py` builds, as `tracetap demo --runtime docker` does).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from typing import Any

from tracetap.rollout.harnesses.base import HarnessContext, Step

DEFAULT_MAX_TURNS = 12


def max_turns(settings: Mapping[str, Any]) -> int:
    value = settings.get("max_turns", DEFAULT_MAX_TURNS)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"agent.settings.max_turns must be a positive integer, got {value!r}")
    return value


class BuiltinAgent:
    name = "builtin"
    api = "openai_chat"

    def files(self, ctx: HarnessContext) -> dict[str, str]:
        return {}

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {}

    def run_steps(self, ctx: HarnessContext) -> list[Step]:
        python = "python" if ctx.contained else sys.executable
        argv = [python, "-m", "tracetap.agent", "--max-turns", str(max_turns(ctx.settings)),
                "--task-id", ctx.task_id, "--workspace", ctx.layout.workspace]
        argv += ["--model", ctx.model_name] if ctx.model_name else []
        return [Step("agent", shlex.join([*argv, "--", ctx.instruction]))]

    def postrun_steps(self, ctx: HarnessContext) -> list[Step]:
        return []
