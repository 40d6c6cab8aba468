"""The calls the vllm tier makes through a gateway: each official SDK once, and a forced tool session.

Shared by the tier's tests of both tokenization modes; every function takes the gateway process and a
session name (the SDKs send `sk-tap-<name>` as their key, which names the session).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import anthropic
import live
import openai
from google import genai
from google.genai import types
from tracetap.store import connect

SYSTEM = "You are terse."
QUESTION = "List the files here."
MAX_TOKENS = 12
BASH = {"name": "Bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


def rows(gw, session: str) -> list[dict]:
    """The session's stored completions, in order."""
    return live.store_rows(gw.store, "session_id = ?", [f"sk-tap-{session}"])


def openai_chat(gw, session: str, stream: bool) -> str:
    sdk = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-{session}", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    common = {"model": "tiny", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 1, "seed": 7,
              "tools": [{"type": "function", "function": BASH}]}
    if not stream:
        return sdk.chat.completions.create(**common).choices[0].message.content or ""
    return "".join(chunk.choices[0].delta.content or "" for chunk in sdk.chat.completions.create(**common, stream=True)
                   if chunk.choices)


def openai_responses(gw, session: str, stream: bool) -> str:
    sdk = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-{session}", max_retries=0)
    common = {"model": "tiny", "instructions": SYSTEM, "input": QUESTION, "max_output_tokens": MAX_TOKENS,
              "temperature": 1, "tools": [{"type": "function", **BASH}]}
    if not stream:
        return sdk.responses.create(**common).output_text
    with sdk.responses.stream(**common) as events:
        return events.get_final_response().output_text


def anthropic_messages(gw, session: str, stream: bool) -> str:
    sdk = anthropic.Anthropic(base_url=gw.url, api_key=f"sk-tap-{session}", max_retries=0)
    tool = {"name": BASH["name"], "description": BASH["description"], "input_schema": BASH["parameters"]}
    common = {"model": "claude-tiny", "system": SYSTEM, "max_tokens": MAX_TOKENS,
              "messages": [{"role": "user", "content": QUESTION}], "tools": [tool]}
    if not stream:
        message = sdk.messages.create(**common)
    else:
        with sdk.messages.stream(**common) as events:
            message = events.get_final_message()
    return "".join(block.text for block in message.content if block.type == "text")


def gemini(gw, session: str, stream: bool) -> str:
    sdk = genai.Client(api_key=f"sk-tap-{session}", http_options=types.HttpOptions(base_url=gw.url))
    config = types.GenerateContentConfig(
        system_instruction=SYSTEM, max_output_tokens=MAX_TOKENS, temperature=1,
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(**BASH)])])
    common = {"model": "gemini-2.5-flash", "contents": QUESTION, "config": config}
    if not stream:
        return gemini_text(sdk.models.generate_content(**common))
    return "".join(gemini_text(chunk) for chunk in sdk.models.generate_content_stream(**common))


def gemini_text(response: types.GenerateContentResponse) -> str:
    parts = response.candidates[0].content.parts or [] if response.candidates else []
    return "".join(part.text or "" for part in parts)


# api name as stored -> caller(gw, session, stream) -> the text the SDK received
CALLERS: dict[str, Callable[..., str]] = {"openai_chat": openai_chat, "openai_responses": openai_responses,
                                          "anthropic_messages": anthropic_messages, "gemini": gemini}


def trace_metadata(store: Path, session_id: str) -> list[dict]:
    """The metadata of the session's prefix_merging traces, in trace order."""
    query = ("SELECT metadata_json FROM trajectories WHERE builder = 'prefix_merging' AND session_id = ? "
             "ORDER BY trace_index")
    return [json.loads(text) for (text,) in connect(store).execute(query, [session_id]).fetchall()]


def forced_bash(command: str) -> dict:
    """vLLM's structured outputs forcing one Hermes `<tool_call>` (the random model never makes one itself);
    `command` goes into the regex as is, so it holds no regex syntax."""
    call = r'<tool_call>\n\{"name": "Bash", "arguments": \{"command": "' + command + r'"\}\}\n</tool_call>'
    return {"structured_outputs": {"regex": call}}


def run_tool_session(gw, session: str) -> None:
    """Two forced Bash calls, each answered with a tool result, then a free answer (OpenAI chat SDK)."""
    sdk = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-{session}", max_retries=0)
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    common = {"model": "tiny", "tools": [{"type": "function", "function": BASH}], "temperature": 0}
    for command, output in (("ls", "a.py\nb.py"), ("cat notes", "hello")):
        message = sdk.chat.completions.create(messages=messages, max_tokens=60, extra_body=forced_bash(command),
                                              **common).choices[0].message
        [call] = message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("Bash", {"command": command})
        result = {"role": "tool", "tool_call_id": call.id, "content": output}
        messages += [message.model_dump(exclude_none=True), result]
    sdk.chat.completions.create(messages=messages, max_tokens=MAX_TOKENS, **common)
