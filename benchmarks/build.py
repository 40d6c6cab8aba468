"""Build benchmark: per_request and prefix_merging against a plain DuckDB scan of the token columns.

    python benchmarks/build.py --sessions 2000 --turns 50 --max-context 32768

Writes a store of synthetic agent sessions through the real store writer (benchmarks/synthetic_chat.py),
first `--also-at` sessions, then grown to `--sessions`, and at each size times, each in a fresh
process: the floor (DuckDB summing the lengths of the stored token columns, `prompt_suffix_ids`
(or a version-1 `prompt_token_ids`) and `completion_token_ids`, over the live completions files),
then `builders.runner.build` with prefix_merging and per_request, with the worker processes
`tracetap build` would start (builders.runner.default_workers).
The page cache is warm for all three (an untimed read of the store goes first). Reports tokens/s
(prompt + sampled tokens of the store per second), the ratio to the scan, the RSS high-water mark of
each process, bytes on disk per session and each builder's trace and training-token counts. With
`--phases N` (default 256) it also times a prefix_merging build's steps (read, route, write) in one
process over N sessions against DuckDB scanning the same sessions on one thread. Prints a Markdown
table and a JSON line with the raw numbers. An existing `--out` with the same shape is
grown, not regenerated.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import duckdb
from synthetic_chat import Shape, session_id, write_sessions
from tracetap.builders.runner import (
    BUILDERS,
    READ_BATCH,
    build,
    default_workers,
    list_sessions,
    load_batch,
)
from tracetap.store import StoreReader, compact_sessions, write_session_tables

KINDS = ("scan", "prefix_merging", "per_request")
LABELS = {"scan": "DuckDB scan (floor)", "prefix_merging": "prefix_merging", "per_request": "per_request"}
# the stored token columns (v2: a prompt is stored as its new suffix); token counts from prompt_tokens
SCAN_SQL = ("SELECT count(*), sum(prompt_tokens), sum(len(completion_token_ids)), "
            "sum(len(coalesce(prompt_suffix_ids, prompt_token_ids))) FROM read_parquet(?, union_by_name = true)")
STATS_SQL = ("SELECT count(*), max(tokens), sum(tokens) FROM (SELECT session_id, "
             "sum(prompt_tokens + len(completion_token_ids)) AS tokens FROM read_parquet(?) GROUP BY 1)")
TRACES_SQL = ("SELECT count(*), sum(len(prompt_token_ids) + len(response_token_ids)), sum(list_sum(loss_mask)) "
              "FROM read_parquet(?)")


def _peak_rss_mb() -> float:
    """This process's RSS high-water mark. VmHWM, not ru_maxrss: Linux carries ru_maxrss over from
    the forking parent across exec, so a child's ru_maxrss may be its parent's size."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")) / 1024


def _query(sql: str, files: list[str]) -> tuple:
    """The one row of `sql` over the Parquet `files` (a fresh in-memory connection)."""
    with duckdb.connect() as con:
        row = con.execute(sql, [files]).fetchone()
    assert row is not None  # an aggregate always has its one row
    return row


def _completion_files(root: Path) -> list[str]:
    return [str(path) for path in StoreReader(root).files("completions")]


def measure_here(kind: str, root: Path) -> dict:
    """Run one measurement in this process (meant to be a fresh one): seconds, peak RSS, results."""
    baseline = _peak_rss_mb()
    start = time.perf_counter()
    if kind == "scan":
        rows, prompt, sampled, _ = _query(SCAN_SQL, _completion_files(root))
        result = {"rows": rows, "tokens": int(prompt + sampled)}
    else:
        summary = build(root, kind, workers=default_workers(len(list_sessions(root))))
        result = {key: value for key, value in summary.to_dict().items() if key != "session_stats"}
        result["not_trainable"] = len(result["not_trainable"])
    seconds = time.perf_counter() - start
    workers_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest worker process
    return {"kind": kind, "seconds": seconds, "peak_rss_mb": max(_peak_rss_mb(), workers_rss),
            "baseline_rss_mb": baseline, **result}


def measure(kind: str, root: Path) -> dict:
    """One measurement in a fresh subprocess, so its peak RSS is its own."""
    done = subprocess.run([sys.executable, __file__, "--measure", kind, "--out", str(root)],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"measuring {kind} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def measure_repeated(root: Path, repeat: int) -> dict:
    """Each measurement `repeat` times, interleaved; per kind the median run, with the highest peak RSS."""
    runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for _ in range(repeat):
        for kind in KINDS:
            runs[kind].append(measure(kind, root))
    results = {}
    for kind, kind_runs in runs.items():
        median = sorted(kind_runs, key=lambda run: run["seconds"])[(len(kind_runs) - 1) // 2]
        results[kind] = {**median, "seconds_all": [run["seconds"] for run in kind_runs],
                         "peak_rss_mb": max(run["peak_rss_mb"] for run in kind_runs)}
    return results


def _size(paths) -> int:
    return sum(path.stat().st_size for path in paths if path.is_file())


def trace_counts(root: Path, builder: str) -> dict:
    """Traces, tokens in them (prompt + response) and loss-mask-1 tokens, as stored."""
    files = [Path(uri) for uri in StoreReader(root).files("trajectories") if f"/builder={builder}/" in uri]
    traces, tokens, trained = _query(TRACES_SQL, [str(path) for path in files])
    return {"traces": traces, "trace_tokens": int(tokens), "loss_tokens": int(trained),
            "output_bytes": _size(files)}


def grow(root: Path, sessions: int, shape: Shape, writers: int, staging: Path) -> dict:
    """Record the sessions the store lacks, then compact it; timings of both."""
    have = set(list_sessions(root)) if root.exists() else set()
    missing = [index for index in range(sessions) if session_id(index) not in have]
    start = time.perf_counter()
    rows = write_sessions(root, missing, shape, writers, staging) if missing else 0
    written = time.perf_counter() - start
    merged = compact_sessions(root)  # close_session committed each session already: expect nothing left
    return {"sessions_written": len(missing), "rows_written": rows, "write_seconds": written,
            "compaction_left": len(merged), "compact_seconds": time.perf_counter() - start - written}


def phases(root: Path, sessions: int) -> dict:
    """CPU ms per session of a prefix_merging build's steps in this process, over the first `sessions`
    sessions (read in READ_BATCH batches, written in the build's files), and of DuckDB scanning the same
    sessions' token columns on one thread: where a build's time goes, against the floor."""
    reader = StoreReader(root)
    wanted = reader.session_ids()[:sessions]
    totals = dict.fromkeys(["read", "route", "write", "scan"], 0.0)
    for start in range(0, len(wanted), READ_BATCH):
        batch = wanted[start:start + READ_BATCH]
        marks = [time.process_time()]
        loaded = load_batch(reader, batch)
        marks.append(time.process_time())
        built = [BUILDERS["prefix_merging"](rows, session=row) for rows, row in loaded]
        marks.append(time.process_time())
        traces = [(sid, session_traces) for sid, (session_traces, _) in zip(batch, built, strict=True)]
        write_session_tables(root, "trajectories", traces, builder="prefix_merging", writer="benchmark")
        marks.append(time.process_time())
        for step, begin, end in zip(["read", "route", "write"], marks, marks[1:], strict=False):
            totals[step] += end - begin
    chosen = {f"session_id={sid}" for sid in wanted}
    files = [path for path in _completion_files(root) if Path(path).parent.name in chosen]
    with duckdb.connect(config={"threads": 1}) as con:
        begin = time.process_time()
        con.execute(SCAN_SQL, [files]).fetchone()
        totals["scan"] = time.process_time() - begin
    return {step: seconds / len(wanted) * 1e3 for step, seconds in totals.items()}


def run_stage(root: Path, sessions: int, shape: Shape, args: argparse.Namespace) -> dict:
    """Grow the store to `sessions`, then measure the scan and both builders."""
    stage = {"sessions": sessions, **grow(root, sessions, shape, args.writers, args.staging or root.parent)}
    files = _completion_files(root)
    count, largest, tokens = _query(STATS_SQL, files)  # also warms the page cache
    stage.update(store_sessions=count, store_tokens=int(tokens), largest_session_tokens=int(largest),
                 disk_bytes_per_session=_size(Path(f) for f in files) / count
                 + _size(root.glob("sessions/*/*.parquet")) / count)
    stage["results"] = measure_repeated(root, args.repeat)
    for builder in KINDS[1:]:
        stage["results"][builder].update(trace_counts(root, builder))
    stage["checks"] = checks(stage)
    if args.phases:
        stage["phases_ms_per_session"] = phases(root, args.phases)
    return stage


def checks(stage: dict) -> dict:
    """What the synthetic sessions guarantee: one drift-free chain each, nothing lost by either builder."""
    results = stage["results"]
    merged, per_request = results["prefix_merging"], results["per_request"]
    return {
        "scan_saw_every_token": results["scan"]["tokens"] == stage["store_tokens"],
        "one_chain_per_session": merged["chains"] == merged["segments"] == stage["sessions"],
        "no_drift_or_breaks": merged["drift_tokens"] == 0 and not merged["break_reasons"],
        "same_loss_tokens": merged["loss_tokens"] == per_request["loss_tokens"],
        "one_trace_per_call": per_request["traces"] == results["scan"]["rows"],
    }


def _table_row(stage: dict, kind: str, scan_seconds: float) -> str:
    r = stage["results"][kind]
    cells = [f"{stage['sessions']:,}", LABELS[kind], f"{r['seconds']:.1f}",
             f"{stage['store_tokens'] / r['seconds'] / 1e6:.1f}", f"{r['seconds'] / scan_seconds:.2f}",
             f"{r['peak_rss_mb']:.0f}", f"{r['peak_rss_mb'] - r['baseline_rss_mb']:.0f}"]
    if kind == "scan":
        cells += ["-"] * 4
    else:
        cells += [f"{r['traces']:,}", f"{r['trace_tokens']:,}", f"{r['loss_tokens']:,}",
                  f"{r['output_bytes'] / stage['sessions'] / 2**20:.2f}"]
    return "| " + " | ".join(cells) + " |"


def markdown(stages: list[dict], shape: Shape, repeat: int) -> str:
    last = stages[-1]
    lines = [
        f"Synthetic store: {last['sessions']:,} sessions x {shape.turns} turns, context growing to "
        f"{shape.max_context:,} tokens ({last['store_tokens'] / 1e9:.2f} G prompt + sampled tokens, "
        f"{last['disk_bytes_per_session'] / 2**20:.1f} MiB on disk per session, largest session "
        f"{last['largest_session_tokens'] * 4 / 2**20:.1f} MiB of int32 ids). Each step runs in a fresh "
        f"process (median of {repeat}); peak RSS is its VmHWM (or its largest worker's), growth is over its "
        f"RSS right before the step (interpreter and libraries loaded). Warm page cache; DuckDB uses all "
        f"{os.cpu_count()} cores, the builders read sessions in batches of {READ_BATCH} and run in "
        f"{default_workers(last['sessions'])} worker process(es) (builders.runner READ_BATCH, default_workers).",
        "",
        "| sessions | step | seconds | M tokens/s | x scan | peak RSS MiB | RSS growth MiB | traces | tokens in traces "
        "| loss-1 tokens | written MiB/session |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for stage in stages:
        scan = stage["results"]["scan"]["seconds"]
        lines += [_table_row(stage, kind, scan) for kind in KINDS]
    lines += [_phases_line(stage) for stage in stages if "phases_ms_per_session" in stage]
    return "\n".join(lines)


def _phases_line(stage: dict) -> str:
    ms = stage["phases_ms_per_session"]
    build = ms["read"] + ms["route"] + ms["write"]
    steps = ", ".join(f"{step} {ms[step]:.2f} ({ms[step] / ms['scan']:.2f}x)" for step in ("read", "route", "write"))
    return (f"\n{stage['sessions']:,} sessions, CPU ms per session in one process (x the scan's {ms['scan']:.2f} on "
            f"one thread): {steps}; the build {build:.2f} ({build / ms['scan']:.2f}x).")


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--max-context", type=int, default=32768)
    parser.add_argument("--also-at", type=int, default=500, help="also measure at this many sessions (0: skip)")
    parser.add_argument("--writers", type=int, default=2, help="writer processes generating the store")
    parser.add_argument("--staging", type=Path, default=Path("/dev/shm") if Path("/dev/shm").is_dir() else None,
                        help="where writer processes keep their shard stores (default: /dev/shm)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measurement (the median is reported)")
    parser.add_argument("--out", type=Path, help="benchmark directory (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the store afterwards")
    parser.add_argument("--phases", type=int, default=256, metavar="N",
                        help="also time a build's steps in one process over N sessions (0: skip)")
    parser.add_argument("--measure", choices=KINDS, help=argparse.SUPPRESS)
    return parser.parse_args()


def _check_shape(out: Path, shape: Shape) -> None:
    """Refuse to grow a store generated with another shape (its numbers would mix)."""
    recorded = out / "bench.json"
    if recorded.exists() and json.loads(recorded.read_text()) != asdict(shape):
        raise SystemExit(f"{out} holds a store of another shape: {recorded.read_text()}")
    recorded.write_text(json.dumps(asdict(shape)))


def main() -> None:
    args = _arguments()
    if args.measure:
        print(json.dumps(measure_here(args.measure, args.out)))
        return
    shape = Shape(turns=args.turns, max_context=args.max_context)
    out = args.out or Path(tempfile.mkdtemp(prefix="tracetap-build-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    _check_shape(out, shape)
    try:
        sizes = sorted({n for n in (args.also_at, args.sessions) if 0 < n <= args.sessions})
        stages = [run_stage(out / "store", n, shape, args) for n in sizes]
    finally:
        if not args.keep:
            shutil.rmtree(out / "store", ignore_errors=True)
            (out / "bench.json").unlink(missing_ok=True)
            if args.out is None:
                out.rmdir()
    print(markdown(stages, shape, args.repeat))
    print(json.dumps({"shape": asdict(shape), "writers": args.writers, "repeat": args.repeat,
                      "cpus": os.cpu_count(), "stages": stages}))


if __name__ == "__main__":
    main()
