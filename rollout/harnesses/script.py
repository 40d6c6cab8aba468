"""Scripts for the scripted embedded engine that drive a CLI preset through its own shell tool.

Used by the harness test tier and `tracetap demo --harness`: the CLI runs the given commands with its
shell tool in turn, then ends with a final answer. Requests that offer tools play the main loop; side
calls without tools (titles, checks) get SIDE_REPLY, so they never use up a main-loop line, whenever
they arrive (engine/README.md, scripted mode).
"""

from __future__ import annotations

import json
from pathlib import Path

from tracetap.rollout.harnesses.cli import CliHarness

SIDE_REPLY = "tracetap harness run"
# The CLIs' system prompts alone are 1.5k-17k tokens and they ask for up to 32k output tokens.
GATEWAY_ARGS = ("--max-model-len", "40960")


def script_lines(harness: CliHarness, commands: list[str], final: str) -> list[dict]:
    main = [harness.shell_call(command) for command in commands] + [{"content": final}]
    return [{"when": {"has_tools": False}, "content": SIDE_REPLY},
            *({"when": {"has_tools": True}, **line} for line in main)]


def write_script(path: Path, harness: CliHarness, commands: list[str], final: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in script_lines(harness, commands, final)))
    return path
