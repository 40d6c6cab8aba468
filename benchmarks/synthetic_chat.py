"""Synthetic agent sessions at token level, recorded through the real store writer.

A session is a ChatML tool-use loop as a harness would send it to a Qwen model: the first prompt is
a system and a user message plus the generation prompt; every later prompt is the previous prompt,
the ids the model sampled (ending in `<|im_end|>`), and an interstitial (a tool result message and
the next generation prompt). So each prompt strictly extends the previous one and prefix merging
has real work: it must find every turn's copy in the next prompt and split off the interstitial.
Text ids follow a Zipf law over the ordinary vocabulary (how real token ids are distributed, which
matters for how well Parquet compresses them); lengths are drawn so the context grows from the
first prompt to exactly `max_context` tokens (last prompt + last sampled ids).

Rows go through `StoreWriter.record_completion` (a durable group-commit log append per call) and every
session is closed with `close_session` (the writer's own commit into the completions table), as a gateway
does. On a disk the fsyncs dominate, so several writer processes each fill shard stores on a staging
directory (tmpfs by default) with disjoint sessions, a batch of sessions per shard, and each shard's
committed rows are loaded into the target store as they are stored (`store.load_recorded`: one commit a
batch, no row re-encoded).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from tracetap.store import StoreWriter, load_recorded

SHARD_SESSIONS = 32  # sessions a shard store records before it is loaded into the target (one commit)
# Qwen2/3 vocabulary: ids below ORDINARY are text; the rest are special tokens.
ORDINARY = 151643
IM_START, IM_END = 151644, 151645
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = 151665, 151666
NEWLINE, SYSTEM, USER, ASSISTANT = 198, 8948, 872, 77091
GENERATION_PROMPT = np.array([IM_START, ASSISTANT, NEWLINE], dtype=np.int32)
MODEL = "Qwen/Qwen3-8B"
# tokens of an interstitial besides the tool result text: "\n", the user header, the two
# tool_response tags, "<|im_end|>\n" and the generation prompt
INTERSTITIAL_OVERHEAD = 1 + 3 + 2 + 2 + len(GENERATION_PROMPT)


@dataclass(frozen=True)
class Shape:
    """How big a session is."""

    turns: int = 50
    max_context: int = 32768
    system_tokens: int = 1200
    user_tokens: int = 300
    sampled_share: float = 0.3  # of the context growth; the rest is tool results


class TextIds:
    """Text token ids with Zipf frequencies (rank r has weight 1/(r+2.7), ranks shuffled over ids).

    One pool of i.i.d. draws is made up front; a text is a slice of it at a random offset, which
    keeps generation cheap next to the writer.
    """

    def __init__(self, seed: int = 0, pool: int = 1 << 22) -> None:
        rng = np.random.default_rng(seed)
        weights = 1.0 / (np.arange(ORDINARY) + 2.7)
        ranks = np.searchsorted(np.cumsum(weights) / weights.sum(), rng.random(pool))
        self._pool = rng.permutation(ORDINARY).astype(np.int32)[np.minimum(ranks, ORDINARY - 1)]

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if n > len(self._pool):
            raise ValueError(f"a text of {n} tokens is longer than the pool")
        start = int(rng.integers(0, len(self._pool) - n + 1))
        return self._pool[start:start + n]


def session_id(index: int) -> str:
    return f"bench-{index:06d}"


def _message(role: int, body: np.ndarray) -> np.ndarray:
    return np.concatenate([[IM_START, role, NEWLINE], body, [IM_END, NEWLINE]]).astype(np.int32)


def _lengths(rng: np.random.Generator, shape: Shape, first_prompt: int) -> tuple[np.ndarray, np.ndarray]:
    """(sampled length per turn, tool result length per interstitial), summing to the context budget."""
    budget = shape.max_context - first_prompt - (shape.turns - 1) * INTERSTITIAL_OVERHEAD
    if budget < 2 * shape.turns:
        raise ValueError(f"max context {shape.max_context} is too small for {shape.turns} turns")
    sampled = shape.sampled_share * rng.uniform(0.5, 1.5, shape.turns)
    tools = (1 - shape.sampled_share) * rng.uniform(0.5, 1.5, shape.turns - 1)
    pieces = np.concatenate([sampled, tools])
    lengths = np.maximum(np.floor(pieces / pieces.sum() * budget).astype(np.int64), 1)
    lengths[: shape.turns] = np.maximum(lengths[: shape.turns], 2)  # text + <|im_end|>
    lengths[np.argmax(lengths)] += budget - lengths.sum()  # exact: the last context is max_context
    return lengths[: shape.turns], lengths[shape.turns:]


def _row(sid: str, turn: int, prompt: np.ndarray, sampled: np.ndarray, last: bool,
         rng: np.random.Generator) -> dict:
    """A completions row as the gateway records an OpenAI Chat call (text bodies left out)."""
    finish = "stop" if last else "tool_calls"
    tool_calls = [] if last else [{"id": f"call_{turn}", "name": "bash", "arguments": '{"command": "ls"}'}]
    message = {"role": "assistant", "content": "done" if last else None,
               "tool_calls": [{"id": call["id"], "type": "function",
                               "function": {"name": call["name"], "arguments": call["arguments"]}}
                              for call in tool_calls]}
    response = {"id": f"chatcmpl-{sid}-{turn}", "object": "chat.completion", "model": MODEL,
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "stop_reason": None}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(sampled)}}
    upstream_ms = float(rng.uniform(200, 4000))
    return {
        "session_id": sid, "task_id": f"task-{int(sid[-6:]) % 100:03d}", "created_at": datetime.now(UTC),
        "api": "openai_chat", "path": "/v1/chat/completions", "stream": False, "requested_model": MODEL,
        "served_model": MODEL, "status": "ok", "http_status": 200, "chat_response_json": json.dumps(response),
        "prompt_token_ids": prompt, "completion_token_ids": sampled,
        "logprobs": -np.abs(rng.normal(0, 0.7, len(sampled))).astype(np.float32),
        "finish_reason": finish, "prompt_tokens": len(prompt), "completion_tokens": len(sampled),
        "tool_calls": tool_calls, "upstream_ms": upstream_ms, "gateway_ms": upstream_ms + 3.0,
        "policy_version": "step-0", "metadata_json": json.dumps({"harness": "synthetic"}),
    }


def session_rows(index: int, shape: Shape, text: TextIds):
    """The session's completions rows in call order (prompts as int32 arrays)."""
    rng = np.random.default_rng(index)
    sid = session_id(index)
    prompt = np.concatenate([_message(SYSTEM, text.draw(rng, shape.system_tokens)),
                             _message(USER, text.draw(rng, shape.user_tokens)), GENERATION_PROMPT])
    sampled_lengths, tool_lengths = _lengths(rng, shape, len(prompt))
    for turn in range(shape.turns):
        last = turn == shape.turns - 1
        sampled = np.append(text.draw(rng, int(sampled_lengths[turn]) - 1), np.int32(IM_END))
        yield _row(sid, turn, prompt, sampled, last, rng)
        if not last:
            result = np.concatenate([[TOOL_RESPONSE_OPEN], text.draw(rng, int(tool_lengths[turn])),
                                     [TOOL_RESPONSE_CLOSE]])
            prompt = np.concatenate([prompt, sampled, [NEWLINE], _message(USER, result),
                                     GENERATION_PROMPT]).astype(np.int32)


def _load_shard(shard: Path, root: Path) -> None:
    """Commit a closed shard store's rows into `root`, read as any Delta reader reads them."""
    from deltalake import DeltaTable

    completions, sessions = (DeltaTable(str(shard / table)).to_pyarrow_table() for table in ("completions", "sessions"))
    load_recorded(root, completions, sessions, "tracetap benchmark")


def _write_shard(staging: Path, root: Path, indices: list[int], shape: Shape) -> int:
    """One writer process: record and close each session, SHARD_SESSIONS at a time in a fresh shard store
    under `staging`, and load each shard into `root`; returns rows."""
    text, rows = TextIds(), 0
    for start in range(0, len(indices), SHARD_SESSIONS):
        shard = Path(tempfile.mkdtemp(prefix="tracetap-bench-", dir=staging))
        try:
            with StoreWriter(shard) as writer:
                for index in indices[start:start + SHARD_SESSIONS]:
                    for row in session_rows(index, shape, text):
                        writer.record_completion(row)
                        rows += 1
                    writer.close_session(session_id(index))
            _load_shard(shard, root)
        finally:
            shutil.rmtree(shard, ignore_errors=True)
    return rows


def write_sessions(root: Path, indices: list[int], shape: Shape, writers: int, staging: Path) -> int:
    """Record the sessions `indices` into the store at `root`; returns the rows written.

    `writers` processes each run a StoreWriter on a shard store under `staging` (tmpfs keeps the
    writer's fsyncs cheap) and load every closed session into `root`.
    """
    StoreWriter(root).close()  # the store's layout and VERSION, as the writer makes them
    with ProcessPoolExecutor(writers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_write_shard, staging, root, indices[k::writers], shape) for k in range(writers)]
        rows = sum(future.result() for future in futures)
    os.sync()  # the copies reach the disk now, not during the timed builds
    return rows
