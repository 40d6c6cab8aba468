"""The six real coding-agent CLIs from npm, as small presets that run one-shot through a gateway.

Used by the harness test tier and by `tracetap demo --harness NAME`. A preset knows its npm package and
binary, how to point the CLI at a gateway from a private HOME, the one-shot argv for a prompt, which API
it speaks, and the name and argument shape of its shell tool (so a scripted engine can ask for a command).
Every run binds its calls to one session with the `/s/<session>/` path prefix (DESIGN §4), which wins
over the CLI's own session headers (opencode sends `x-session-id`); the API key is the session id too.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tracetap.engine.cache import home_dir

MODEL = "tracetap-model"
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "TZ")
# The CLIs' system prompts alone are 1.5k-17k tokens and they ask for up to 32k output tokens.
GATEWAY_ARGS = ("--max-model-len", "40960")
SIDE_REPLY = "tracetap harness run"  # what side calls without tools (titles, checks) are answered


class HarnessError(RuntimeError):
    """A harness CLI is not installed, or its run failed."""


@dataclass(frozen=True)
class Harness:
    """One CLI: `configure(home, base, sid)` writes its config under `home` and returns its env vars."""

    name: str
    package: str
    binary: str
    api: str
    shell_tool: str
    shell_arguments: Callable[[str], dict]
    configure: Callable[[Path, str, str], dict[str, str]]
    argv: Callable[[str], list[str]]

    def shell_call(self, command: str) -> dict:
        """A scripted assistant message that asks this CLI to run `command` with its shell tool."""
        return {"content": None, "tool_calls": [
            {"function": {"name": self.shell_tool, "arguments": self.shell_arguments(command)}}]}


@dataclass
class HarnessRun:
    harness: str
    session_id: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _claude(home: Path, base: str, sid: str) -> dict[str, str]:
    # Claude Code asks for 128k output tokens by default; a served model's context is smaller.
    tiers = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
             "ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")
    return {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": sid, "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "8192",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "IS_SANDBOX": "1",
            **dict.fromkeys(tiers, MODEL)}


def _codex(home: Path, base: str, sid: str) -> dict[str, str]:
    _write(home / ".codex" / "config.toml", "\n".join([
        f'model = "{MODEL}"', 'model_provider = "tracetap"', "[model_providers.tracetap]",
        'name = "tracetap gateway"', f'base_url = "{base}/v1"', 'env_key = "TRACETAP_KEY"',
        'wire_api = "responses"', ""]))
    return {"TRACETAP_KEY": sid}


def _gemini(home: Path, base: str, sid: str) -> dict[str, str]:
    settings = {"security": {"auth": {"selectedType": "gemini-api-key"}},
                "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}}
    _write(home / ".gemini" / "settings.json", json.dumps(settings))
    return {"GEMINI_API_KEY": sid, "GOOGLE_GEMINI_BASE_URL": base, "GEMINI_CLI_TRUST_WORKSPACE": "true"}


def _qwen(home: Path, base: str, sid: str) -> dict[str, str]:
    return {"OPENAI_BASE_URL": f"{base}/v1", "OPENAI_API_KEY": sid, "OPENAI_MODEL": MODEL}


def _opencode(home: Path, base: str, sid: str) -> dict[str, str]:
    provider = {"npm": "@ai-sdk/openai-compatible", "name": "tracetap gateway",
                "options": {"baseURL": f"{base}/v1", "apiKey": sid}, "models": {MODEL: {}}}
    config = {"$schema": "https://opencode.ai/config.json", "provider": {"tracetap": provider},
              "permission": {"bash": "allow", "edit": "allow", "external_directory": "allow"}}
    _write(home / ".config" / "opencode" / "opencode.json", json.dumps(config))
    return {"OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1"}


def _pi(home: Path, base: str, sid: str) -> dict[str, str]:
    provider = {"baseUrl": f"{base}/v1", "api": "openai-completions", "apiKey": sid,
                "compat": {"supportsDeveloperRole": False, "maxTokensField": "max_tokens"},
                "models": [{"id": MODEL, "contextWindow": 40960, "maxTokens": 8192}]}
    _write(home / ".pi" / "agent" / "models.json", json.dumps({"providers": {"tracetap": provider}}))
    return {"PI_OFFLINE": "1"}


HARNESSES = {h.name: h for h in [
    Harness("claude-code", "@anthropic-ai/claude-code@latest", "claude", "anthropic_messages", "Bash",
            lambda cmd: {"command": cmd, "description": "Run the command"}, _claude,
            lambda prompt: ["-p", prompt, "--dangerously-skip-permissions"]),
    Harness("codex", "@openai/codex", "codex", "openai_responses", "exec_command",
            lambda cmd: {"cmd": cmd}, _codex,
            lambda prompt: ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                            prompt]),
    Harness("gemini-cli", "@google/gemini-cli", "gemini", "gemini", "run_shell_command",
            lambda cmd: {"command": cmd, "description": "Run the command"}, _gemini,
            lambda prompt: ["-p", prompt, "-m", "gemini-2.5-flash", "--yolo"]),
    Harness("qwen-code", "@qwen-code/qwen-code@latest", "qwen", "openai_chat", "run_shell_command",
            lambda cmd: {"command": cmd, "is_background": False}, _qwen,
            lambda prompt: ["--auth-type", "openai", "-m", MODEL, "--yolo", "-p", prompt]),
    Harness("opencode", "opencode-ai", "opencode", "openai_chat", "bash",
            lambda cmd: {"command": cmd, "description": "Run the command"}, _opencode,
            lambda prompt: ["run", "-m", f"tracetap/{MODEL}", prompt]),
    Harness("pi", "@mariozechner/pi-coding-agent", "pi", "openai_chat", "bash",
            lambda cmd: {"command": cmd}, _pi,
            lambda prompt: ["--provider", "tracetap", "--model", MODEL, "-p", prompt]),
]}


def npm_dir() -> Path:
    """Where the CLIs are installed: `$TRACETAP_NPM_DIR`, else `$TRACETAP_HOME/npm`."""
    return Path(os.environ.get("TRACETAP_NPM_DIR") or home_dir() / "npm")


def find_binary(harness: Harness, prefix: Path | None = None) -> Path | None:
    """The CLI from the npm cache dir, else from PATH; None when it is not installed."""
    cached = (prefix or npm_dir()) / "node_modules" / ".bin" / harness.binary
    if cached.exists():
        return cached
    found = shutil.which(harness.binary)
    return Path(found) if found else None


def require_binary(harness: Harness, prefix: Path | None = None) -> Path:
    """The installed CLI, or a HarnessError that says how to install it."""
    binary = find_binary(harness, prefix)
    if binary is None:
        raise HarnessError(
            f"{harness.name}: `{harness.binary}` is not installed (looked in "
            f"{(prefix or npm_dir()) / 'node_modules' / '.bin'} and on PATH). Install it with:\n  "
            + shlex.join(install_command([harness], prefix)))
    return binary


def install_command(harnesses: list[Harness], prefix: Path | None = None) -> list[str]:
    return ["npm", "install", "--prefix", str(prefix or npm_dir()), "--no-audit", "--no-fund",
            "--loglevel", "error", *(h.package for h in harnesses)]


def install(harnesses: list[Harness], prefix: Path | None = None, timeout: float = 900.0) -> None:
    """`npm install` the CLIs missing from the cache dir (an installed one is reused as it is)."""
    prefix = prefix or npm_dir()
    missing = [h for h in harnesses if not (prefix / "node_modules" / ".bin" / h.binary).exists()]
    if missing:
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(install_command(missing, prefix), check=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)


def script_lines(harness: Harness, commands: list[str], final: str) -> list[dict]:
    """A scripted-engine script: the CLI runs `commands` with its shell tool in turn, then says `final`.

    The main loop's lines are for requests that offer tools; side calls without tools get SIDE_REPLY,
    so they never use up a main-loop line, whenever they arrive (engine/README.md, scripted mode).
    """
    main = [harness.shell_call(command) for command in commands] + [{"content": final}]
    return [{"when": {"has_tools": False}, "content": SIDE_REPLY},
            *({"when": {"has_tools": True}, **line} for line in main)]


def write_script(path: Path, harness: Harness, commands: list[str], final: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in script_lines(harness, commands, final)))
    return path


def session_url(gateway_url: str, session_id: str) -> str:
    """The gateway root with the session's path prefix: every call of the run lands in the session."""
    return f"{gateway_url.rstrip('/')}/s/{session_id}"


def harness_env(harness: Harness, home: Path, gateway_url: str, session_id: str) -> dict[str, str]:
    """A clean environment: private HOME, the CLI's config and nothing from the caller's credentials."""
    home.mkdir(parents=True, exist_ok=True)
    env = {key: os.environ[key] for key in KEPT_ENV if key in os.environ}
    # npm offline: a CLI that installs packages at run time (opencode's plugin dir) must not reach out.
    env.update(HOME=str(home), TERM="dumb", NO_COLOR="1", TMPDIR=str(_tmp(home)), npm_config_offline="true")
    env.update(harness.configure(home, session_url(gateway_url, session_id), session_id))
    return env


def _tmp(home: Path) -> Path:
    path = home / "tmp"
    path.mkdir(exist_ok=True)
    return path


def run_harness(harness: Harness, binary: Path, gateway_url: str, session_id: str, prompt: str,
                workspace: Path, home: Path, timeout: float = 180.0) -> HarnessRun:
    """Run the CLI one-shot in `workspace`; on timeout (and after exit) its process group is killed."""
    env = harness_env(harness, home, gateway_url, session_id)
    started = time.monotonic()
    process = subprocess.Popen([str(binary), *harness.argv(prompt)], cwd=workspace, env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    timed_out = False
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process.pid)
        stdout, stderr = process.communicate()
    _kill_group(process.pid)  # helpers the CLI left behind (language servers, relaunch children)
    return HarnessRun(harness.name, session_id, None if timed_out else process.returncode, stdout, stderr,
                      time.monotonic() - started, timed_out)


def check(run: HarnessRun) -> HarnessRun:
    """The run, or a HarnessError with the end of its output when it timed out or exited non-zero."""
    if run.timed_out or run.returncode != 0:
        status = "timed out" if run.timed_out else f"exited with {run.returncode}"
        raise HarnessError(f"{run.harness} {status} after {run.seconds:.0f}s\n--- stderr\n"
                           f"{run.stderr[-2000:]}\n--- stdout\n{run.stdout[-2000:]}")
    return run


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
