"""Token continuity: drift and chain breaks in both tokenization modes, and what continuing a prompt costs.

1. The same scripted multi-turn tool sessions (every reply sampled as non-canonical ids, `"tokens":
   "split"`) go through a gateway over the embedded engine in `upstream` and in `gateway` mode; the
   prefix_merging build reports drift tokens per 1,000 sampled tokens and chain breaks per session.
2. In process, with the engine's Qwen3 tokenizer: rendering + tokenizing a ~20k-token prompt from scratch
   vs continuing the previous call (render, prefix check, tokenize only the new part).

    python benchmarks/continuity.py --sessions 4 --turns 6 --prompt-tokens 20000
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from tracetap.builders import build
from tracetap.capture.continuity import Continuity
from tracetap.engine.pieces import split_ids
from tracetap.engine.tokenizer import load_tokenizer
from tracetap.store import connect

from tracetap.common import decode
from tracetap.launch import start_gateway

COMMAND = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS = [{"type": "function", "function": {"name": "Bash", "description": "Run.", "parameters": COMMAND}}]


def script(turns: int) -> list[dict]:
    """`turns` split tool calls, then a split answer."""
    call = {"content": "Looking again at the files.", "tokens": "split",
            "tool_calls": [{"function": {"name": "Bash", "arguments": {"command": "ls -la"}}}]}
    return [call] * turns + [{"content": "There are two files; both are small.", "tokens": "split"}]


def run_session(url: str, session: str, turns: int) -> None:
    """The harness loop over the OpenAI chat API: answer every tool call, stop at the text answer."""
    messages: list = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Look."}]
    headers = {"authorization": f"Bearer sk-tap-{session}"}
    for _ in range(turns + 1):
        body = {"model": "tiny", "messages": messages, "tools": TOOLS}
        message = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120).json()[
            "choices"][0]["message"]
        if not message.get("tool_calls"):
            return
        messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "a b"}]


def mode_figures(root: Path, mode: str, sessions: int, turns: int) -> dict[str, float]:
    """Drift tokens per 1,000 sampled tokens and chain breaks per session in one tokenization mode."""
    (root / mode).mkdir()
    scripted = root / mode / "script.jsonl"
    scripted.write_text("".join(json.dumps(line) + "\n" for line in script(turns)))
    args = ["--script", str(scripted)] + (["--tokenize", "gateway"] if mode == "gateway" else [])
    with start_gateway(root / mode / "store", *args) as gateway:
        for index in range(sessions):
            run_session(f"http://127.0.0.1:{gateway.port}", f"{mode}-{index}", turns)
        summary = build(gateway.store, "prefix_merging", decode=decode)
        (sampled,) = connect(gateway.store).execute("SELECT sum(completion_tokens) FROM completions").fetchone() or (0,)
    stats = list(summary.session_stats.values())
    drift = sum(s["drift_tokens"] for s in stats)
    breaks = sum(s["segments"] - 1 for s in stats)
    return {"drift_per_1k": 1000 * drift / sampled, "breaks_per_session": breaks / len(stats),
            "sampled": sampled, "drift": drift}


def conversation(tokens: int) -> list[dict]:
    """A tool session whose rendered prompt holds about `tokens` tokens."""
    messages: list = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Look."}]
    output = "src/module_%d.py: def handler(request): return respond(request.body, status=200)\n"
    call = {"type": "function", "function": {"name": "Bash", "arguments": {"command": "cat src"}}}
    for turn in range(tokens // 440):
        messages += [{"role": "assistant", "content": "Reading.", "tool_calls": [call]},
                     {"role": "tool", "content": "".join(output % i for i in range(turn * 20, turn * 20 + 20))}]
    return messages


def latency(prompt_tokens: int, repeats: int) -> dict[str, float]:
    """Median ms to build the last prompt of a long session: from scratch vs continuing the previous call."""
    tokenizer = load_tokenizer()
    messages = conversation(prompt_tokens)
    earlier, reply = messages[:-2], messages[-2]
    turn = tokenizer.assistant_turn(earlier, {k: v for k, v in reply.items() if k != "role"})
    sampled = split_ids(tokenizer.encode(turn), tokenizer)
    scratch, continued, size = [], [], 0
    for _ in range(repeats):
        memory = Continuity(tokenizer, tokenizer.end_of_turn)
        memory.remember("s", "c1", memory.prompt("s", tokenizer.render(earlier, TOOLS)), sampled)
        started = time.perf_counter()
        prompt = memory.prompt("s", tokenizer.render(messages, TOOLS))
        continued.append(time.perf_counter() - started)
        assert prompt.continues == "c1"
        started = time.perf_counter()
        size = len(tokenizer.encode(tokenizer.render(messages, TOOLS)))
        scratch.append(time.perf_counter() - started)
    return {"tokens": size, "scratch_ms": 1000 * statistics.median(scratch),
            "continued_ms": 1000 * statistics.median(continued)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=6, help="tool calls per session before the answer")
    parser.add_argument("--prompt-tokens", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("upstream", "gateway"):
            figures = mode_figures(Path(tmp), mode, args.sessions, args.turns)
            print(f"{mode:9} drift tokens / 1k sampled: {figures['drift_per_1k']:.1f} "
                  f"({figures['drift']} of {figures['sampled']}), chain breaks / session: "
                  f"{figures['breaks_per_session']:.2f}")
    timing = latency(args.prompt_tokens, args.repeats)
    print(f"{timing['tokens']}-token prompt: render+tokenize from scratch {timing['scratch_ms']:.1f} ms, "
          f"with continuity {timing['continued_ms']:.1f} ms")


if __name__ == "__main__":
    main()
