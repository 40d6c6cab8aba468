"""Compact encoding of a long session's request: what one call's body costs the writer as history grows.

    python benchmarks/compact_encoding.py [--messages 100 500 2000] [--repeat 20]

Each agent call resends the whole conversation, so a session of N messages sends bodies of N chunks, all but
the newest stored before. Times `encode_body` (store/compact_form.py: cut the body into chunks, hash them,
look each key up in the session's History) on such a body, its chunks already remembered: the work every
later call of that session does. Median of `--repeat` runs, one process; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

from tracetap.capture.jsontext import dumps
from tracetap.store.compact_form import History, encode_body


def body(messages: int) -> str:
    turns = [{"role": "user" if i % 2 else "assistant", "content": f"message {i}: " + "x" * 200}
             for i in range(messages)]
    return dumps({"model": "m", "messages": turns})


def seconds_per_body(messages: int, repeat: int) -> float:
    text, history = body(messages), History()
    encode_body(history, text, [])  # the session stored them on earlier calls
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        encode_body(history, text, [])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[100, 500, 2000])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print("| messages | body KB | ms per body | µs per message |\n|---:|---:|---:|---:|")
    for messages in args.messages:
        seconds = seconds_per_body(messages, args.repeat)
        print(f"| {messages:,} | {len(body(messages)) / 1024:.0f} | {seconds * 1e3:.2f} | {seconds / messages * 1e6:.2f} |")


if __name__ == "__main__":
    main()
