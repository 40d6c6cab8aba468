"""Store size benchmark: bytes a session costs on disk against its information floor.

    python benchmarks/store_size.py [--turns 10 50 200] [--first 20000 9000 1300] [--new 400]

For each first-request size (Claude Code's ~20k tokens, Codex's ~9k, pi's ~1.3k) and session length,
writes one linear agent session through the real StoreWriter: every turn samples ~30% of `--new`
tokens and gets a tool result with the rest, and the next request repeats the whole conversation
(Anthropic-shaped `request_json`, Chat-shaped `chat_request_json`, with the text of every token).
Measured after `close_session`, i.e. the session's data file in the completions Delta table (its one
commit), and once the writer has closed, every file of the store (that file, the sessions table, both
tables' Delta logs, and whatever the group-commit log still holds). The floor is
4 B per unique token id (the last call's prompt + sampled ids), 4 B per sampled logprob and the conversation's text once
(UTF-8). Also reports the median time of one `record_completion` (compact encoding and the fsync'd
log append), the same data file written with snappy instead of zstd, and the full form (every call
storing its whole prompt ids and bodies, as schema version 1 did, snappy) for comparison.
Prints a Markdown table and a JSON line with the raw numbers.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tracetap.store import TABLES, StoreReader, StoreWriter, storage_schema

VOCAB = 150_000
SAMPLED_SHARE = 0.3
TOOLS = [{"name": name, "description": f"{name}: " + "does one thing well. " * 40,
          "input_schema": {"type": "object", "properties": {"arg": {"type": "string"}}}}
         for name in ("bash", "read", "edit", "write", "grep", "glob")]


@dataclass
class Result:
    first_tokens: int
    turns: int
    floor_bytes: int
    stored_bytes: int
    snappy_bytes: int
    full_bytes: int
    record_ms: float  # median time of one record_completion (compact encoding + fsync'd file)
    at_rest_bytes: int  # every file of the store once its writer closed: tables, Delta logs, what the log kept
    log_bytes: int  # the log's segment just before close_session: what a writer that kept its live segment
    # until it filled (64 MiB) left at rest on top of the part, as tracetap did before schema version 3

    @property
    def ratio(self) -> float:
        return self.stored_bytes / self.floor_bytes


class Conversation:
    """A synthetic linear session whose text and tokens match one for one (a word per token)."""

    def __init__(self, first_tokens: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.words = ["".join(self.rng.choices("abcdefghijklmnopqrstuvwxyz", k=self.rng.randrange(2, 7)))
                      for _ in range(5000)]
        self.system_ids, self.system = self.piece(first_tokens - 20)
        self.ids = list(self.system_ids)
        self.messages: list[dict] = [{"role": "user", "content": self.piece(20)[1]}]
        self.ids += self.piece(20)[0]
        self.text_bytes = len(self.system.encode()) + len(self.messages[0]["content"].encode())
        self.logprobs = self.unsent_bytes = 0  # unsent: the last tool result, until a call carries it

    def piece(self, tokens: int) -> tuple[list[int], str]:
        ids = [self.rng.randrange(VOCAB) for _ in range(tokens)]
        return ids, " ".join(self.words[i % len(self.words)] for i in ids)

    def bodies(self) -> dict:
        """Both request bodies; like Claude Code, the Anthropic one marks its last message for caching,
        so the message marked last time comes back changed (and is stored again)."""
        last = {**self.messages[-1], "cache_control": {"type": "ephemeral"}}
        request = {"model": "claude-sonnet", "max_tokens": 32000, "system": self.system, "tools": TOOLS,
                   "messages": [*self.messages[:-1], last], "stream": True}
        chat = {"model": "tiny", "messages": [{"role": "system", "content": self.system}, *self.messages],
                "tools": [{"type": "function", "function": tool} for tool in TOOLS], "max_tokens": 32000}
        return {"request_json": json.dumps(request), "chat_request_json": json.dumps(chat)}

    def call(self, sid: str, new_tokens: int) -> dict:
        """One turn: the request repeats the conversation; the answer and its tool result join it."""
        prompt = [*self.ids, 151644, 77091]
        self.text_bytes += self.unsent_bytes
        sampled, said = self.piece(int(new_tokens * SAMPLED_SHARE))
        result_ids, result = self.piece(new_tokens - len(sampled))
        row = {"session_id": sid, "status": "ok", "http_status": 200, "api": "anthropic_messages",
               **self.bodies(), "prompt_token_ids": prompt, "completion_token_ids": sampled,
               "logprobs": [-self.rng.random() for _ in sampled], "prompt_tokens": len(prompt),
               "completion_tokens": len(sampled), "finish_reason": "tool_calls",
               "chat_response_json": json.dumps({"choices": [{"message": {"content": said}}]}),
               "response_json": json.dumps({"content": [{"type": "text", "text": said}]})}
        self.messages = [*self.messages, {"role": "assistant", "content": said},
                         {"role": "user", "content": [{"type": "tool_result", "content": result}]}]
        self.ids = [*prompt, *sampled, *result_ids]
        self.text_bytes += len(said.encode())
        self.unsent_bytes = len(result.encode())
        self.logprobs += len(sampled)
        return row


def measure(first_tokens: int, turns: int, new_tokens: int, seed: int = 0) -> Result:
    sid = f"bench-{first_tokens}-{turns}"
    conversation = Conversation(first_tokens, seed)
    with tempfile.TemporaryDirectory(prefix="tracetap-size-") as tmp:
        root = Path(tmp, "store")
        full_path = Path(tmp, "full.parquet")
        with StoreWriter(root) as writer:
            full_writer: pq.ParquetWriter | None = None
            times = []
            for _ in range(turns):
                row = conversation.call(sid, new_tokens)
                start = time.perf_counter()
                recorded = writer.record_completion(row)
                times.append(time.perf_counter() - start)
                full = pa.Table.from_pylist([recorded], schema=storage_schema(TABLES["completions"]))
                full_writer = full_writer or pq.ParquetWriter(full_path, full.schema)
                full_writer.write_table(full)
            if full_writer is not None:
                full_writer.close()
            log_bytes = sum(path.stat().st_size for path in (root / "log").glob("*.jsonl"))
            writer.close_session(sid)
        [part] = (root / "completions" / f"session_id={sid}").glob("*.parquet")  # one commit: one file
        snappy = Path(tmp, "snappy.parquet")
        pq.write_table(pq.read_table(part), snappy, compression="snappy", use_dictionary=False)
        assert StoreReader(root).completions(sid, ["seq"]).num_rows == turns
        floor = 4 * (len(conversation.ids) - new_tokens + int(new_tokens * SAMPLED_SHARE)) \
            + 4 * conversation.logprobs + conversation.text_bytes
        at_rest = sum(path.stat().st_size for path in root.rglob("*") if path.is_file())
        return Result(first_tokens, turns, floor, part.stat().st_size, snappy.stat().st_size,
                      full_path.stat().st_size, 1000 * statistics.median(times), at_rest, log_bytes)


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f}"


def table(results: list[Result]) -> str:
    lines = ["| first request | turns | floor MB | stored MB (zstd) | ratio | store at rest MB | at-rest ratio | "
             "snappy ratio | full form MB | full ratio | record ms |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| ~{r.first_tokens:,} | {r.turns} | {_mb(r.floor_bytes)} | {_mb(r.stored_bytes)} | "
              f"{r.ratio:.2f}x | {_mb(r.at_rest_bytes)} | {r.at_rest_bytes / r.floor_bytes:.2f}x | "
              f"{r.snappy_bytes / r.floor_bytes:.2f}x | {_mb(r.full_bytes)} | "
              f"{r.full_bytes / r.floor_bytes:.1f}x | {r.record_ms:.1f} |" for r in results]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 50, 200])
    parser.add_argument("--first", type=int, nargs="+", default=[20_000, 9_000, 1_300],
                        help="first-request sizes in tokens")
    parser.add_argument("--new", type=int, default=400, help="new tokens a turn (sampled + tool result)")
    args = parser.parse_args()
    results = [measure(first, turns, args.new) for first in args.first for turns in args.turns]
    print(table(results))
    print(json.dumps([{**asdict(r), "ratio": round(r.ratio, 3)} for r in results]))


if __name__ == "__main__":
    main()
