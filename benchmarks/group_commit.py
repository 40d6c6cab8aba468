"""Per-call durable-write cost of `StoreWriter.record_completion`: group commit against one file per call.

"before" is the `tracetap` package of a git ref whose writer wrote one Parquet file per call (temp name,
fsync, rename, directory fsync), laid out from `git archive REF` and measured in a child process that
imports it; "after" is today's writer (one log append and one fdatasync per batch of calls). Each of T threads records
`--calls` rows into its own session, all at once, on a store under `--dir` (a real disk: fsyncs are
what is measured). A row is a turn of an agent loop: 400 new prompt ids, 200 sampled ids with
logprobs, a 2 KB request. Prints median / p99 ms per call and calls/s for each thread count.

    python benchmarks/group_commit.py [--calls 200] [--threads 1 8 32] [--before-ref 1251e48] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tracetap.store import StoreWriter

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def package_at(ref: str) -> Iterator[Path]:
    """A directory to put on PYTHONPATH for the `tracetap` package as it was at `ref`: the ref's files from
    `git archive`, its pyproject's package-dir mapping laid out with symlinks."""
    with tempfile.TemporaryDirectory(prefix="tracetap-bench-") as tmp:
        source, path = Path(tmp) / "source", Path(tmp) / "path"
        source.mkdir()
        path.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
        mapping = tomllib.loads((source / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
        for name, folder in sorted(mapping.items(), key=lambda item: item[0].count(".")):  # parents first
            (path / name.replace(".", "/")).symlink_to(source / folder, target_is_directory=True)
        yield path


def row(sid: str, rng: np.random.Generator) -> dict:
    return {"session_id": sid, "status": "ok", "api": "openai_chat", "path": "/v1/chat/completions",
            "prompt_token_ids": rng.integers(0, 151643, 400, dtype=np.int32).tolist(),
            "completion_token_ids": rng.integers(0, 151643, 200, dtype=np.int32).tolist(),
            "logprobs": rng.uniform(-5, 0, 200).astype(np.float32).tolist(),
            "request_json": '{"messages": "' + "x" * 2000 + '"}', "prompt_tokens": 400, "completion_tokens": 200}


def run(writer_class: type, root: Path, threads: int, calls: int) -> tuple[list[float], float]:
    """(per-call seconds, wall seconds) of `threads` threads recording `calls` rows each."""
    rng = np.random.default_rng(0)
    rows = [[row(f"t{t}", rng) for _ in range(calls)] for t in range(threads)]
    times: list[float] = []
    lock = threading.Lock()

    def work(mine: list[dict]) -> None:
        local = []
        for one in mine:
            start = time.perf_counter()
            writer.record_completion(one)
            local.append(time.perf_counter() - start)
        with lock:
            times.extend(local)

    with writer_class(root) as writer:
        pool = [threading.Thread(target=work, args=(mine,)) for mine in rows]
        began = time.perf_counter()
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        wall = time.perf_counter() - began
    return times, wall


def report(name: str, threads: int, calls: int, directory: Path | None) -> None:
    """One table row: `threads` threads through the StoreWriter this process imported."""
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        times, wall = run(StoreWriter, Path(tmp) / "store", threads, calls)
    p99 = statistics.quantiles(times, n=100)[98] * 1000
    print(f"| {name} | {threads} | {statistics.median(times) * 1000:.2f} | {p99:.2f} | {len(times) / wall:.0f} |",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="rows per thread")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--before-ref", default="1251e48", help="a commit whose writer wrote a file per call")
    parser.add_argument("--dir", type=Path, default=None, help="where the stores go (default: a temp dir)")
    parser.add_argument("--row-of", help=argparse.SUPPRESS)  # a child's one row, named so, under its PYTHONPATH
    args = parser.parse_args()
    if args.row_of:
        report(args.row_of, args.threads[0], args.calls, args.dir)
        return
    print("| writer | threads | median ms/call | p99 ms/call | calls/s |")
    print("|---|---|---|---|---|")
    with package_at(args.before_ref) as before:
        for threads in args.threads:
            child = [sys.executable, __file__, "--row-of", "before (file per call)", "--threads", str(threads),
                     "--calls", str(args.calls), *(["--dir", str(args.dir)] if args.dir else [])]
            subprocess.run(child, check=True, env={**os.environ, "PYTHONPATH": str(before)})
            report("after (group commit)", threads, args.calls, args.dir)


if __name__ == "__main__":
    main()
