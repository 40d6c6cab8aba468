"""A small tool-using coding agent, written with the official `openai` SDK.

It is the demo's stand-in for a real harness: it talks Chat Completions to whatever base URL it is
given (the gateway), and executes the tools the model asks for inside one workspace directory.
`python -m tracetap.agent INSTRUCTION` runs it as a harness CLI would (the rollout `builtin` preset):
base URL, session id and task id default to `$OPENAI_BASE_URL`, `$OPENAI_API_KEY` and `$TASK_ID`; with no
base URL it calls the SDK's default host, which a proxy-mode gateway answers (`HTTPS_PROXY`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command in the workspace and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file in the workspace (relative path), replacing its content.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
]

SYSTEM_PROMPT = "You are a careful coding agent. Use the tools to inspect and fix the project."


@dataclass
class AgentRun:
    session_id: str
    turns: int = 0
    tool_calls: list[str] = field(default_factory=list)
    final_message: str | None = None


def run_shell(workspace: Path, command: str, timeout: float = 60.0) -> str:
    # The agent's `python` must be the one tracetap runs under, so tests in the workspace find pytest.
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    try:
        done = subprocess.run(command, shell=True, cwd=workspace, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"[timed out after {timeout:.0f}s]"
    return (done.stdout + done.stderr)[-4000:] + f"\n[exit code {done.returncode}]"


def write_file(workspace: Path, path: str, content: str) -> str:
    target = (workspace / path).resolve()
    if not target.is_relative_to(workspace.resolve()):
        return f"refused: {path} is outside the workspace"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    return f"wrote {len(content)} bytes to {path}"


def execute_tool(workspace: Path, name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        return f"invalid arguments: {exc}"
    if name == "run_shell":
        return run_shell(workspace, str(args.get("command", "")))
    if name == "write_file":
        return write_file(workspace, str(args.get("path", "")), str(args.get("content", "")))
    return f"unknown tool {name}"


def run_agent(base_url: str | None, session_id: str, task: str, workspace: Path, model: str = "demo-model",
              max_turns: int = 12, task_id: str | None = None) -> AgentRun:
    """Loop until the model answers without tool calls (or max_turns). The API key is the session id;
    `task_id` labels every call (header `x-tracetap-task`)."""
    from openai import OpenAI

    headers = {"x-tracetap-task": task_id} if task_id else None
    client = OpenAI(base_url=base_url, api_key=session_id, max_retries=0, default_headers=headers)
    messages: list[Any] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task}]
    run = AgentRun(session_id=session_id)
    for _ in range(max_turns):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                               max_tokens=512, temperature=0)
        run.turns += 1
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True, exclude={"annotations", "refusal"}))
        if not message.tool_calls:
            run.final_message = message.content
            return run
        for call in message.tool_calls:
            if call.type != "function":  # only function tools are declared
                continue
            run.tool_calls.append(call.function.name)
            output = execute_tool(workspace, call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return run


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(prog="python -m tracetap.agent", description="Run the demo agent once.")
    parser.add_argument("instruction")
    parser.add_argument("--base-url", default=env.get("OPENAI_BASE_URL"),
                        help="default: $OPENAI_BASE_URL, else the SDK's own (through a proxy-mode gateway)")
    parser.add_argument("--session-id", default=env.get("OPENAI_API_KEY"), help="default: $OPENAI_API_KEY")
    parser.add_argument("--task-id", default=env.get("TASK_ID"), help="default: $TASK_ID")
    parser.add_argument("--workspace", type=Path, default=Path.cwd(), help="default: the current directory")
    parser.add_argument("--model", default="demo-model")
    parser.add_argument("--max-turns", type=int, default=12)
    args = parser.parse_args(argv)
    if not args.session_id:
        parser.error("a session id is needed (--session-id or $OPENAI_API_KEY)")
    if args.max_turns < 1:
        parser.error("--max-turns must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run once and print the run as JSON (turns, tool calls, final message)."""
    args = _arguments(argv)
    run = run_agent(args.base_url, args.session_id, args.instruction, args.workspace, model=args.model,
                    max_turns=args.max_turns, task_id=args.task_id)
    print(json.dumps(dataclasses.asdict(run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
