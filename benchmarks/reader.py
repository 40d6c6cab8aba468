"""Reader benchmark: what a SQL statement and a one-session read cost in a store of many sessions.

    python benchmarks/reader.py --sessions 2000 [--out DIR] [--repeat 5]

Records small synthetic sessions (benchmarks/synthetic_chat.py, 5 turns each, closed and committed as a
gateway leaves them; the shard loads commit 32 sessions a commit) and builds their per_request traces, so
completions, sessions and trajectories each hold one file per session. Then times, page cache warm, the
median of `--repeat` runs of: the refresh every statement starts with (store/catalog.py: the uncommitted
rows read, each table brought to its latest version; timed alone), `SELECT count(*)` over each view,
`SELECT 1`, the same count on a connection limited to one session, and `StoreReader.completions` of one
session. Prints a Markdown table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from synthetic_chat import Shape, session_id, write_sessions
from tracetap.builders import build
from tracetap.store import StoreConnection, StoreReader, connect

SHAPE = Shape(turns=5, max_context=2048, system_tokens=200, user_tokens=50)


def median_ms(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return sorted(times)[(repeat - 1) // 2] * 1000


def _count(con: StoreConnection, table: str) -> Callable[[], object]:
    return lambda: con.execute(f"SELECT count(*) FROM {table}").fetchall()


def measure(root: Path, repeat: int) -> dict[str, float]:
    """Milliseconds per operation on the store at `root`."""
    con, one = connect(root), session_id(0)
    scoped, reader = connect(root, session_ids=[one]), StoreReader(root)
    operations = {
        "the refresh a statement starts with": con.refresh,
        "SELECT 1": lambda: con.execute("SELECT 1").fetchall(),
        **{f"SELECT count(*) FROM {table}": _count(con, table)
           for table in ("completions", "sessions", "trajectories")},
        "one-session connection: SELECT count(*) FROM completions":
            lambda: scoped.execute("SELECT count(*) FROM completions").fetchall(),
        "StoreReader.completions(one session)": lambda: reader.completions(one),
    }
    return {name: median_ms(run, repeat) for name, run in operations.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--out", type=Path, help="store directory (reused when it exists; default: a temp dir)")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="tracetap-reader-")) / "store"
    if not root.exists():
        write_sessions(root, list(range(args.sessions)), SHAPE, args.writers, Path(tempfile.gettempdir()))
        build(root, "per_request")
    results = measure(root, args.repeat)
    print(f"| operation ({len(StoreReader(root).session_ids())} sessions) | ms |\n|---|---|")
    for name, ms in results.items():
        print(f"| {name} | {ms:.0f} |")
    print(json.dumps({"store": str(root), "ms": results}))


if __name__ == "__main__":
    main()
