"""`tracetap export`: one builder's trajectories, rewards joined, as a training dataset.

Formats: `parquet` (canonical, one row per trace, see export_rows.CANONICAL), `jsonl` (the same
rows as JSON lines), `slime` (JSON lines of slime Sample dicts), `verl` (Parquet of verl agent-loop
rows) and `atif` (a directory with one ATIF JSON document per session). Sessions are read one at a
time, so memory is bounded by the largest session; the output appears atomically when complete.
A trace's `group_id` is the session metadata's `group_id`, else its task id, else its session id.

The summary's `table_versions` are the Delta table versions the export read, taken once it has read
everything: an export `as_of` those versions (store.AsOf, `tracetap export --as-of table=N,...`) writes the
same bytes again later, whatever was recorded, compacted or rebuilt since. No format has a manifest file to
keep them in, so the summary (`--json`) is where they are recorded. Without `as_of` the export reads
sessions and completions live, with what writers hold uncommitted (no version holds that): at rest (no
gateway running), the recorded versions reproduce it exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tracetap.builders import export_rows as rows_
from tracetap.builders.export_atif import atif_document, session_completions
from tracetap.builders.export_budget import apply_budget
from tracetap.builders.export_writers import JsonDirSink, JsonlSink, ParquetSink
from tracetap.builders.rewards import join_session, load_rewards
from tracetap.store import AsOf, Reader, StorePath, StoreReader, store_path, validate_name

FORMATS = ("parquet", "jsonl", "slime", "verl", "atif")


class ExportError(ValueError):
    """An export that cannot run as asked (bad format, no trajectories, budget on ATIF)."""


@dataclass
class ExportSummary:
    format: str
    out: str
    sessions: int = 0
    traces: int = 0
    written: int = 0
    dropped_over_budget: int = 0
    clipped: int = 0
    error_traces: int = 0
    not_trainable_traces: int = 0
    unrewarded_traces: int = 0
    table_versions: dict[str, int | None] = field(default_factory=dict)  # the Delta table versions it read


def trajectory_sessions(root: StorePath | str, builder: str, as_of: AsOf | None = None) -> list[str]:
    """Ids of the sessions with trajectories of `builder` (as of a moment, when given), in session order."""
    return StoreReader(root, as_of).trajectory_session_ids(builder)


def _session_info(reader: Reader, session_ids: list[str]) -> dict[str, dict]:
    info = {}
    for row in reader.sessions(session_ids):
        try:
            metadata = json.loads(row["metadata_json"] or "{}")
        except json.JSONDecodeError:
            metadata = {}
        group = metadata.get("group_id") if isinstance(metadata, dict) else None
        info[row["session_id"]] = {**{k: row[k] for k in ("session_id", "task_id", "harness")}, "group_id": group}
    return info


class _Rows:
    """Token-level formats: each session's canonical rows, converted, to a Parquet or JSONL sink."""

    def __init__(self, fmt: str, out: Path, force: bool) -> None:
        self.fmt, self.index, self.rollouts = fmt, 0, 0
        self.groups: dict[str, int] = {}
        schema = rows_.VERL if fmt == "verl" else rows_.CANONICAL
        self.sink = ParquetSink(out, schema, force) if fmt in ("parquet", "verl") else JsonlSink(out, force)

    def _convert(self, row: dict) -> dict:
        if self.fmt == "verl":
            return rows_.verl_row(row)
        if self.fmt == "slime":
            group = self.groups.setdefault(row["group_id"], len(self.groups))
            self.index += 1
            return rows_.slime_sample(row, self.index - 1, group, self.rollouts)
        return row

    def add(self, session: dict, traces: list[dict], rows: list[dict]) -> None:
        self.sink.write([self._convert(row) for row in rows])
        self.rollouts += 1


class _Atif:
    def __init__(self, out: Path, force: bool, reader: Reader, builder: str, evaluator: str | None) -> None:
        self.sink, self.reader, self.builder, self.evaluator = JsonDirSink(out, force), reader, builder, evaluator

    def add(self, session: dict, traces: list[dict], rows: list[dict]) -> None:
        completions = session_completions(self.reader, session["session_id"])
        self.sink.write_document(session["session_id"],
                                 atif_document(session, traces, completions, self.builder, self.evaluator))


def _sessions(reader: Reader, builder: str, session_ids: list[str],
              evaluator: str | None) -> Iterator[tuple[dict, list]]:
    """(session info, traces joined with rewards) per session, read one session at a time."""
    infos = _session_info(reader, session_ids)
    rewards = load_rewards(reader, evaluator) if evaluator else {}
    for sid in session_ids:
        traces = reader.trajectories(builder, [sid]).to_pylist()
        info = dict(infos.get(sid) or {"session_id": sid, "task_id": None, "harness": None, "group_id": None})
        info["task_id"] = info["task_id"] or next((t["task_id"] for t in traces if t.get("task_id")), None)
        info["group_id"] = info["group_id"] or info["task_id"] or sid
        if evaluator:
            traces = join_session(traces, rewards.get(sid), evaluator)
        yield info, traces


def _fit(summary: ExportSummary, rows: list[dict], max_tokens: int | None) -> list[dict]:
    kept = []
    for row in rows:
        fitted = apply_budget(row, max_tokens)
        if fitted is None:
            summary.dropped_over_budget += 1
            continue
        summary.clipped += fitted is not row
        summary.error_traces += fitted.get("status") == "error"
        summary.not_trainable_traces += fitted.get("status") == "not_trainable"
        summary.unrewarded_traces += fitted.get("reward") is None
        kept.append(fitted)
    return kept


def _check_options(fmt: str, max_tokens: int | None, evaluator: str | None) -> None:
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    if max_tokens is not None and (fmt == "atif" or max_tokens < 1):
        raise ExportError("--max-tokens needs a positive number and a token-level format (not atif)")
    if evaluator:
        validate_name(evaluator, "evaluator name")


def _exported(reader: Reader, builder: str, session_ids: Collection[str] | None) -> list[str]:
    """The sessions with trajectories of `builder` to export (of `session_ids`, when given); an ExportError
    when there are none."""
    sessions = reader.trajectory_session_ids(builder)
    if session_ids is not None:
        sessions = [sid for sid in sessions if sid in set(session_ids)]
    if not sessions:
        raise ExportError(f"no trajectories of builder {builder!r} in {reader.root}; run `tracetap build` first")
    return sessions


def export(root: StorePath | str, builder: str, fmt: str, out: Path | str, *, max_tokens: int | None = None,
           evaluator: str | None = None, force: bool = False,
           on_session: Callable[[str], None] | None = None,
           session_ids: Collection[str] | None = None, as_of: AsOf | None = None) -> ExportSummary:
    """Write the dataset to `out` (only `session_ids` when given, e.g. one rollout task's sessions; the store
    as of a moment, when given); returns counts (traces dropped by the budget included) and the versions read."""
    root, out = store_path(root), Path(out)
    _check_options(fmt, max_tokens, evaluator)
    reader: Reader = StoreReader(root, as_of)
    sessions = _exported(reader, builder, session_ids)
    target = _Atif(out, force, reader, builder, evaluator) if fmt == "atif" else _Rows(fmt, out, force)
    summary = ExportSummary(fmt, str(out))
    try:
        for info, traces in _sessions(reader, builder, sessions, evaluator):
            rows = _fit(summary, [rows_.canonical_row(t, info, evaluator) for t in traces], max_tokens)
            target.add(info, traces, rows)
            summary.sessions += 1
            summary.traces += len(traces)
            summary.written += len(rows)
            if on_session:
                on_session(info["session_id"])
    except BaseException:
        target.sink.abort()
        raise
    summary.table_versions = reader.versions()  # now: what the live reads of sessions and completions loaded
    target.sink.commit()
    return summary
