"""Random agent sessions for the compact-form tests: every shape the builders know, from one seed.

A session has threads (the main agent, sub-agents); each call picks a thread and a move: a linear turn,
a retry of the thread's last prompt, drift (the next prompt re-tokenizes the sampled turn), a rewritten
history (a shorter prefix, then new tokens), a truncation at length (maybe with nothing sampled), a
failed call without tokens. Request bodies are JSON written with varied formatting, or no JSON at all.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

WORDS = ["ls", "pytest -q", "fix", "ünïcødé", "emoji \U0001f600", "quote \" and \\ slash", "\x01 raw", "tab\t"]


@dataclass
class Thread:
    tokens: list[int]
    messages: list[dict]
    last_prompt: list[int] | None = None
    system: str = ""
    tools: list[dict] = field(default_factory=list)


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(0, 150_000) for _ in range(n)]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 12)))


def _dumps(rng: random.Random, body: dict) -> str:
    style = rng.randrange(4)
    if style == 0:
        return json.dumps(body)
    if style == 1:
        return json.dumps(body, indent=rng.choice([1, 2]), ensure_ascii=False)
    if style == 2:
        return json.dumps(body, separators=(",", ":"))
    return " \n" + json.dumps(body, indent="\t") + "\n"


def _bodies(rng: random.Random, thread: Thread) -> dict:
    roll = rng.random()
    if roll < 0.05:
        return {"request_json": None, "chat_request_json": None}
    if roll < 0.1:
        return {"request_json": "not json \x01 " + _text(rng), "chat_request_json": "[1, 2]"}
    anthropic = {"model": "claude", "max_tokens": 512, "system": thread.system, "tools": thread.tools,
                 "messages": thread.messages, "stream": rng.random() < 0.5}
    chat = {"model": "tiny", "messages": [{"role": "system", "content": thread.system}, *thread.messages],
            "tools": [{"type": "function", "function": tool} for tool in thread.tools]}
    return {"request_json": _dumps(rng, anthropic), "chat_request_json": _dumps(rng, chat)}


def _new_thread(rng: random.Random, main: Thread | None) -> Thread:
    if main is not None and rng.random() < 0.6:  # a sub-agent sharing the system prompt
        head = main.tokens[: rng.randrange(0, len(main.tokens) + 1)]
        return Thread(list(head), [{"role": "user", "content": _text(rng)}], system=main.system, tools=main.tools)
    tools = [{"name": f"tool{i}", "description": _text(rng), "input_schema": {"type": "object"}}
             for i in range(rng.randrange(0, 4))]
    return Thread(_ids(rng, rng.choice([0, 10, 70, 300])), [{"role": "user", "content": _text(rng)}],
                  system=_text(rng) * rng.randrange(1, 4), tools=tools)


def _prompt(rng: random.Random, thread: Thread, move: str) -> list[int]:
    if move == "retry" and thread.last_prompt is not None:
        return thread.last_prompt
    if move == "rewrite":
        thread.tokens = thread.tokens[: rng.randrange(0, len(thread.tokens) + 1)]
        thread.messages = thread.messages[: rng.randrange(1, len(thread.messages) + 1)]
    if move == "drift" and thread.tokens:
        cut = rng.randrange(max(0, len(thread.tokens) - 5), len(thread.tokens))
        thread.tokens = thread.tokens[:cut] + _ids(rng, rng.randrange(1, 4))
    return thread.tokens + _ids(rng, rng.randrange(0, 120)) + [7, 8]


def _call(rng: random.Random, sid: str, thread: Thread) -> dict:
    move = rng.choice(["turn", "turn", "turn", "retry", "drift", "rewrite", "length", "failed"])
    row = {"session_id": sid, "api": "anthropic_messages", **_bodies(rng, thread)}
    if move == "failed":
        return {**row, "status": "upstream_error", "http_status": 500}
    prompt = _prompt(rng, thread, move)
    sampled = _ids(rng, rng.randrange(0, 3) if move == "length" else rng.randrange(1, 60))
    sampled += [] if move == "length" else [2]
    thread.last_prompt, thread.tokens = prompt, prompt + sampled
    thread.messages = [*thread.messages, {"role": "assistant", "content": _text(rng)},
                       {"role": "user", "content": [{"type": "tool_result", "content": _text(rng)}]}]
    return {**row, "status": "ok", "prompt_token_ids": prompt, "completion_token_ids": sampled,
            "logprobs": [-0.5] * len(sampled), "finish_reason": "length" if move == "length" else "stop"}


def session_calls(seed: int, sid: str, calls: int) -> list[dict]:
    """`calls` completions rows of one random session."""
    rng = random.Random(seed)
    threads = [_new_thread(rng, None)]
    rows = []
    for _ in range(calls):
        if rng.random() < 0.15:
            threads.append(_new_thread(rng, threads[0]))
        rows.append(_call(rng, sid, rng.choice(threads)))
    return rows
