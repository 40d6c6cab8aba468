"""A long session's call through the store writer: what one call costs as the conversation grows.

    python benchmarks/compact_encoding.py [--messages 100 500 2000] [--repeat 20]

Each agent call resends the whole conversation with the newest turn added, so a session of N messages sends
bodies of N chunks, all but the newest stored before. Records such calls (`request_json` and
`chat_request_json` both holding the body, each call two messages longer than the one before) through the
real StoreWriter (the compact encoding finds what the body repeats of the previous call's, cuts the rest into
chunks, hashes them and looks each key up in the session's memory; then the row check, the log line, the
append and fdatasync) after a first call that stored the first N messages. With `--side-calls` another thread
of the session (a side call, a sub-agent) sends its own short conversation before each call, as Claude Code's
side calls do. Median of `--repeat` calls, one process, a temporary store; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from tracetap.capture.jsontext import dumps
from tracetap.store import StoreWriter


def body(messages: int, thread: str = "main") -> str:
    turns = [{"role": "user" if i % 2 else "assistant", "content": f"{thread} message {i}: " + "x" * 200}
             for i in range(messages)]
    return dumps({"model": "m", "messages": turns})


def row(messages: int, thread: str = "main") -> dict:
    text = body(messages, thread)
    return {"session_id": "long", "status": "ok", "request_json": text, "chat_request_json": text}


def seconds_per_call(messages: int, repeat: int, side_calls: bool = False) -> float:
    """Median seconds of the main thread's calls (a side call's, when asked, is made before each and not timed)."""
    calls = [row(messages + 2 * turn) for turn in range(repeat + 1)]
    with tempfile.TemporaryDirectory() as tmp, StoreWriter(tmp) as writer:
        writer.record_completion(calls[0])  # the session stored the first messages on earlier calls
        times = []
        for turn, call in enumerate(calls[1:]):
            if side_calls:
                writer.record_completion(row(3 + turn, "side"))
            start = time.perf_counter()
            writer.record_completion(call)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[100, 500, 2000])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--side-calls", action="store_true",
                        help="another thread of the session (a side call, a sub-agent) calls before each call")
    args = parser.parse_args()
    print("| messages | body KB | ms per call | µs per message |\n|---:|---:|---:|---:|")
    for messages in args.messages:
        seconds = seconds_per_call(messages, args.repeat, args.side_calls)
        kb = len(body(messages)) / 1024
        print(f"| {messages:,} | {kb:.0f} | {seconds * 1e3:.2f} | {seconds / messages * 1e6:.2f} |")


if __name__ == "__main__":
    main()
