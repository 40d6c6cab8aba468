"""Per-call durable-write cost of `StoreWriter.record_completion`: group commit against one file per call.

"before" is the writer of a git ref that wrote one Parquet file per call (temp name, fsync, rename,
directory fsync), loaded from `git show REF:store/writer.py` over today's store modules; "after" is
today's writer (one log append and one fdatasync per batch of calls). Each of T threads records
`--calls` rows into its own session, all at once, on a store under `--dir` (a real disk: fsyncs are
what is measured). A row is a turn of an agent loop: 400 new prompt ids, 200 sampled ids with
logprobs, a 2 KB request. Prints median / p99 ms per call and calls/s for each thread count.

    python benchmarks/group_commit.py [--calls 200] [--threads 1 8 32] [--before-ref 1251e48] [--dir DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from tracetap.store import StoreWriter

REPO = Path(__file__).resolve().parents[1]


def load_writer(ref: str) -> type:
    """StoreWriter as it was at `ref` (its module run against today's store package)."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{ref}:store/writer.py"], check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="tracetap-bench-")) / "writer_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("writer_before", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.StoreWriter


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="rows per thread")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--before-ref", default="1251e48", help="a commit whose writer wrote a file per call")
    parser.add_argument("--dir", type=Path, default=None, help="where the stores go (default: a temp dir)")
    args = parser.parse_args()
    writers = {"before (file per call)": load_writer(args.before_ref), "after (group commit)": StoreWriter}
    print("| writer | threads | median ms/call | p99 ms/call | calls/s |")
    print("|---|---|---|---|---|")
    for threads in args.threads:
        for name, writer_class in writers.items():
            with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
                times, wall = run(writer_class, Path(tmp) / "store", threads, args.calls)
            p99 = statistics.quantiles(times, n=100)[98] * 1000
            print(f"| {name} | {threads} | {statistics.median(times) * 1000:.2f} | {p99:.2f} | "
                  f"{len(times) / wall:.0f} |", flush=True)


if __name__ == "__main__":
    main()
