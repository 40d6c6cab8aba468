"""Run a builder over a store: read each session's completions, write its rows of `trajectories`.

Sessions are read in small batches (READ_BATCH), so memory is bounded by the largest sessions, not
the store. With `workers` > 1 the batches are built in that many worker processes (routing is Python
and holds the GIL, so threads share one core; `tracetap build` picks one per core for a large build,
default_workers). Workers are spawned, so a script calling `build` with workers needs the usual
`if __name__ == "__main__":` guard. Otherwise a batch or two are built at a time in this process
(BUILD_THREADS): one thread's Parquet decoding and fsyncs (which release the GIL) overlap another's
routing. A batch's traces are one commit of the `trajectories` Delta table (store.write_session_tables),
whose metadata records the versions of completions and sessions the batch read (`tracetap history` shows
them). A build `as_of` a past moment (store.AsOf) reads every batch at that moment's versions, so its record
names exactly what it read; a build of the store as it is reads each batch live (store/reading.py), with
what writers hold uncommitted, which no version holds.
Results are taken in session order. Token columns are handed to the builders as numpy views over
the Arrow buffers (no per-token Python objects), prompts in the compact form capture stored (a
reference and a suffix), so no prompt is read whole unless a builder needs it. Each session's traces replace
its earlier ones of the builder in that commit; a session with no trace has its earlier ones removed, so a
rebuild never leaves stale traces.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pyarrow as pa
from tracetap.builders import per_request, prefix_merging
from tracetap.builders.base import Builder
from tracetap.builders.drift import Decode
from tracetap.store import AsOf, Reader, StorePath, StoreReader, validate_session_id, write_session_tables

READ_TABLES = ("completions", "sessions")  # what a build reads: the versions its commits record
READ_COLUMNS = ["session_id", "seq", "completion_id", "task_id", "status", "http_status", "served_model",
                "prompt_ref_seq", "prompt_ref_len", "prompt_suffix_ids", "completion_token_ids", "logprobs",
                "finish_reason", "tool_calls", "chat_response_json", "policy_version", "metadata_json"]
NUMPY_COLUMNS = {"prompt_suffix_ids": np.int32, "completion_token_ids": np.int32, "logprobs": np.float32}
BUILD_THREADS = 2  # batches in flight: ~1.5x faster prefix_merging on 2 cores (benchmarks/build.py)
READ_BATCH = 8  # sessions read and committed together: one listing and one trajectories commit per batch
# (a batch's traces are in memory at once: per_request's 64-session batches peaked at 2 GB RSS)
PROCESS_MIN_SESSIONS = 128  # fewer sessions build faster in process than a worker takes to start (~0.4 s)
MAX_WORKERS = 8
BUILDERS: dict[str, Builder] = {
    per_request.NAME: per_request.build_session,
    prefix_merging.NAME: prefix_merging.merge_session,
}


@dataclass
class BuildSummary:
    """Totals of one build, plus each session's reconstruction stats."""

    builder: str
    sessions: int = 0
    traces: int = 0
    chains: int = 0
    segments: int = 0
    break_reasons: Counter = field(default_factory=Counter)
    drift_tokens: int = 0
    drift_tokens_by_kind: Counter = field(default_factory=Counter)
    retries: int = 0
    degraded: int = 0  # completions the upstream answered without training data (never in a trace)
    not_trainable: list[str] = field(default_factory=list)
    session_stats: dict[str, dict] = field(default_factory=dict)
    # completions and sessions versions read: as of a moment, its versions; else the newest any batch read
    table_versions: dict[str, int | None] = field(default_factory=dict)

    def read(self, versions: dict[str, int | None]) -> None:
        """Take account of the table versions one batch read."""
        for table, version in versions.items():
            known = self.table_versions.get(table)
            if known is None or (version is not None and version > known):
                self.table_versions[table] = version

    def add(self, session_id: str, stats: dict) -> None:
        self.sessions += 1
        self.traces += stats["traces"]
        self.chains += stats.get("chains", 0)
        self.segments += stats.get("segments", 0)
        self.break_reasons.update(stats.get("break_reasons", {}))
        self.drift_tokens += stats.get("drift_tokens", 0)
        self.drift_tokens_by_kind.update(stats.get("drift_tokens_by_kind", {}))
        self.retries += stats.get("retries", 0)
        self.degraded += stats.get("completions_degraded", 0)
        if not stats["trainable"]:
            self.not_trainable.append(session_id)
        self.session_stats[session_id] = stats

    def to_dict(self) -> dict:
        return {"builder": self.builder, "sessions": self.sessions, "traces": self.traces,
                "chains": self.chains, "segments": self.segments, "break_reasons": dict(self.break_reasons),
                "drift_tokens": self.drift_tokens, "drift_tokens_by_kind": dict(self.drift_tokens_by_kind),
                "retries": self.retries, "degraded": self.degraded,
                "not_trainable": self.not_trainable, "session_stats": self.session_stats,
                "table_versions": self.table_versions}


def list_sessions(store_root: StorePath | str, as_of: AsOf | None = None) -> list[str]:
    """Ids of the sessions with recorded completions (as of a moment, when given), sorted."""
    return StoreReader(store_root, as_of).session_ids()


def _list_column(column: pa.ChunkedArray, dtype) -> list[np.ndarray | None]:
    """A list<...> column as numpy views, one per row (None for null lists)."""
    out: list[np.ndarray | None] = []
    for chunk in column.chunks:
        offsets = chunk.offsets.to_numpy()
        values = chunk.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
        valid = chunk.is_valid().to_numpy(zero_copy_only=False)
        out += [values[offsets[i]:offsets[i + 1]] if valid[i] else None for i in range(len(chunk))]
    return out


def table_rows(table: pa.Table) -> list[dict]:
    """Rows of a completions table; token columns as numpy arrays, the rest as Python values."""
    columns = {name: _list_column(table.column(name), NUMPY_COLUMNS[name]) if name in NUMPY_COLUMNS
               else table.column(name).to_pylist() for name in table.column_names}
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def load_session(store_root: StorePath | str, session_id: str) -> tuple[list[dict], dict | None]:
    """(the session's completion rows in seq order, its sessions row or None)."""
    return load_batch(StoreReader(store_root), [validate_session_id(session_id)])[0]


def load_batch(reader: Reader, session_ids: list[str]) -> list[tuple[list[dict], dict | None]]:
    """Each session's (completion rows, sessions row), read with one listing per table."""
    tables = reader.completions_of(session_ids, READ_COLUMNS)
    sessions = {row["session_id"]: row for row in reader.sessions(session_ids)}
    return [(table_rows(tables[sid]), sessions.get(sid)) for sid in session_ids]


def default_workers(sessions: int) -> int:
    """Worker processes worth starting for a build of `sessions`: one per usable core for a large build,
    else 1 (build in this process)."""
    if sessions < PROCESS_MIN_SESSIONS:
        return 1
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


def _executor(workers: int, decode: Decode | None) -> Executor:
    """Worker processes, or threads in this process for one worker or a `decode` no process can be
    handed (a lambda or a closure: only module-level functions pickle)."""
    if workers > 1:
        try:
            pickle.dumps(decode)
        except (pickle.PicklingError, AttributeError, TypeError):
            workers = 1
    if workers == 1:
        return ThreadPoolExecutor(BUILD_THREADS, thread_name_prefix="tracetap-build")
    # spawn, not fork: the caller may hold threads (Arrow's pools, a server's) a forked child would inherit locked
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def build(store_root: StorePath | str, builder: str, session_ids: Iterable[str] | None = None,
          eot_id: int | None = None, progress: Callable[[str], None] | None = None,
          decode: Decode | None = None, workers: int = 1, as_of: AsOf | None = None) -> BuildSummary:
    """Build `builder`'s trajectories for the given sessions (default: all) into the store.

    `eot_id` overrides end-of-turn detection (prefix_merging). `progress` is called with each
    session id once that session is written. `decode` (ids -> text, the model's tokenizer) tells
    tokenization drift from content drift (without it, drift is unclassified and not trainable).
    `workers`: processes building in parallel (1: build in this process; see default_workers).
    `as_of`: build from the store as it was then (its committed completions and sessions); the traces
    are written to the store as it is.
    """
    _check_options(builder, eot_id, workers)
    reader = StoreReader(store_root, as_of)  # an AsOfError now for a moment the store lacks
    wanted = _wanted(reader, session_ids)
    summary = BuildSummary(builder, table_versions={} if as_of is None else reader.versions(READ_TABLES))
    pool = _executor(workers, decode)
    try:
        batches = [wanted[start:start + READ_BATCH] for start in range(0, len(wanted), READ_BATCH)]
        results = pool.map(partial(_build_batch, reader.root, builder, eot_id, decode, reader.as_of), batches)
        for batch, (stats, read) in zip(batches, results, strict=True):
            summary.read(read)
            for sid, session_stats in zip(batch, stats, strict=True):
                summary.add(sid, session_stats)
                if progress is not None:
                    progress(sid)
    finally:
        pool.shutdown(cancel_futures=True)  # after an error, sessions not yet started are not built
    return summary


def _check_options(builder: str, eot_id: int | None, workers: int) -> None:
    """A ValueError for an unknown builder, a bad end-of-turn id or worker count, before anything is read."""
    if builder not in BUILDERS:
        raise ValueError(f"unknown builder {builder!r}; builders: {', '.join(BUILDERS)}")
    if eot_id is not None and (isinstance(eot_id, bool) or not isinstance(eot_id, int) or eot_id < 0):
        raise ValueError(f"end-of-turn id must be a non-negative integer, got {eot_id!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")


def _wanted(reader: Reader, session_ids: Iterable[str] | None) -> list[str]:
    """The sessions to build (default: every recorded one), each once; a ValueError names unrecorded ones."""
    known = reader.session_ids()
    wanted = known if session_ids is None else list(dict.fromkeys(map(validate_session_id, session_ids)))
    missing = sorted(set(wanted) - set(known))
    if missing:
        raise ValueError(f"no completions recorded for session(s): {', '.join(missing)}")
    return wanted


def _build_batch(root: StorePath, builder: str, eot_id: int | None, decode: Decode | None, as_of: AsOf | None,
                 session_ids: list[str]) -> tuple[list[dict], dict[str, int | None]]:
    """Build a few sessions' traces and commit them at once, recording the table versions read; returns their
    stats and those versions. Runs in a worker process too (`as_of` pinned: it resolves without reading)."""
    reader = StoreReader(root, as_of)
    built = [BUILDERS[builder](rows, eot_id=eot_id, session=session, decode=decode)
             for rows, session in load_batch(reader, session_ids)]
    traces = [(sid, session_traces) for sid, (session_traces, _) in zip(session_ids, built, strict=True)]
    read = reader.versions(READ_TABLES)
    write_session_tables(root, "trajectories", traces, builder=builder, writer="tracetap build", read_versions=read)
    return [stats for _, stats in built], read
