"""The harness contract: a preset turns an instruction into setup files and shell steps.

Presets are pure: they compute what to write and what to run from a `HarnessContext`; the node writes
the files and runs the steps through the session's runtime, with `gateway_env(ctx)` plus the preset's
env plus the task's agent env. Every model call of the harness authenticates with the session's secret
key as its API key (or proxy credential), so the gateway binds it to the rollout session whatever
session header the CLI sends itself; the session id is only a name (DESIGN §4, §9).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tracetap.rollout.runtimes.base import SessionLayout


@dataclass(frozen=True)
class HarnessContext:
    session_id: str
    session_key: str              # the secret the harness calls the gateway with (capture/capabilities.py)
    task_id: str
    instruction: str
    gateway_url: str              # the gateway root as the runtime reaches it, no /v1
    layout: SessionLayout
    model_name: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    contained: bool = False       # the runtime is a container: CLIs are on the image's PATH, not this host's
    via_proxy: bool = False       # the gateway is the harness's HTTPS proxy: no base URLs, default API hosts


@dataclass(frozen=True)
class Step:
    """One `bash -lc` command; logs go to logs/agent/<name>.{stdout,stderr}.log."""

    name: str
    command: str
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None  # default: the workspace


class Harness(Protocol):
    name: str
    api: str  # the provider API it speaks (completions.api)

    def files(self, ctx: HarnessContext) -> dict[str, str]:
        """Config files to write before the run: runtime path -> text."""

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        """Env for every step, on top of `gateway_env(ctx)`."""

    def run_steps(self, ctx: HarnessContext) -> list[Step]:
        """The harness run itself (usually one step)."""

    def postrun_steps(self, ctx: HarnessContext) -> list[Step]:
        """Steps after the run, e.g. copying the CLI's own session logs into logs/agent."""


def base_url(ctx: HarnessContext) -> str:
    """The gateway root (no /v1): the session key, not the URL, names the session."""
    return ctx.gateway_url.rstrip("/")


def gateway_env(ctx: HarnessContext) -> dict[str, str]:
    """What every step sees: the gateway's base URL for each provider API (or, via the proxy, the proxy
    and its CA), the session key as every API key, and the session's folders (reference system §5.6)."""
    key, lay = ctx.session_key, ctx.layout
    keys = {"ANTHROPIC_API_KEY": key, "OPENAI_API_KEY": key, "GOOGLE_API_KEY": key, "GEMINI_API_KEY": key}
    return {
        **keys, **_routing_env(ctx),
        "SESSION_ID": ctx.session_id, "TASK_ID": ctx.task_id, "HOME": lay.home, "SESSION_DIR": lay.root,
        "WORKSPACE": lay.workspace, "ARTIFACTS_DIR": lay.artifacts, "LOGS_DIR": lay.logs,
        "AGENT_LOG_DIR": lay.agent_logs,
    }


def _routing_env(ctx: HarnessContext) -> dict[str, str]:
    if ctx.via_proxy:
        from tracetap.capture.proxy_client import proxy_env

        return proxy_env(ctx.gateway_url, ctx.session_key)
    base = base_url(ctx)
    return {"ANTHROPIC_BASE_URL": base, "OPENAI_BASE_URL": f"{base}/v1", "GOOGLE_API_URL": base,
            "GOOGLE_GEMINI_BASE_URL": base}
