"""Run store-reading tests on every store form a user can have: the read-side suites call `as_form(root)`
once a test store is written, and scripts/test.sh runs them again with TRACETAP_TEST_STORE_FORM set.

- `v3` (default): the store as the writers left it (every table a Delta table, an empty log);
- `v2-migrated`: the same rows rewritten in schema version 2's file layout, as a gateway that died while
  compacting left it (below), then `tracetap migrate`d;
- `v1-migrated`: as v2, with every session's completions as full rows in one part and no log (VERSION 1),
  then migrated.

Schema version 2 kept each table as a tree of Parquet files, written here with plain pyarrow (today's
writers write Delta tables): `completions/session_id=<sid>/` holding `part-<n>.parquet` (seqs 0..n-1, in
the compact form) and per-call files `<seq:08d>-<id>.parquet`, plus the rows of the writers'
group-commit logs (`log/*.jsonl`, the same lines as today's); `sessions/session_id=<sid>/session.parquet`
(no `revision`); `rewards/session_id=<sid>/<evaluator>.parquet`;
`trajectories/builder=<b>/session_id=<sid>/*.parquet`; `rollouts/task_id=<id>/task.json`. A reader
showed of a session its highest part, the per-call files past it, then the log rows past both.
Readers refuse a store older than the current version, so the older forms are only ever read migrated.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tracetap.store import StoreReader, migrate_store, storage_schema
from tracetap.store.commit_log import encode_line
from tracetap.store.delta import DELTA_TABLES, open_table, read
from tracetap.store.reading import stored_completions
from tracetap.store.schema import SESSIONS, STORED_COMPLETIONS

FORMS = ("v3", "v2-migrated", "v1-migrated")
FIXTURE = Path(__file__).parent / "fixtures" / "store-v1"
V1_SCHEMA = pq.read_schema(FIXTURE / "completions/session_id=linear/part-5.parquet")  # version 1's completions
V1_SESSIONS = pq.read_schema(FIXTURE / "sessions/session_id=linear/session.parquet")
V2_COMPLETIONS = storage_schema(STORED_COMPLETIONS)  # the compact form
V2_SESSIONS = pa.schema([field for field in storage_schema(SESSIONS) if field.name != "revision"])
DEAD_WRITER = "0ld2wr1ter"  # the writer id of the log a dead version-2 gateway left


def store_form() -> str:
    form = os.environ.get("TRACETAP_TEST_STORE_FORM", "v3")
    if form not in FORMS:
        raise ValueError(f"TRACETAP_TEST_STORE_FORM must be one of {FORMS}, not {form!r}")
    return form


def as_form(root: Path, form: str | None = None) -> Path:
    """Rewrite the store at `root` (no writer open on it) in `form` (default: the environment's)."""
    form = form or store_form()
    if form != "v3":
        downgrade(root, 1 if form == "v1-migrated" else 2)
        migrate_store(root)
    return root


def downgrade(root: Path, version: int) -> None:
    """Rewrite a current store (no writer open on it) in the file layout of schema version 2 (or 1)."""
    completions = _full_rows(root) if version == 1 else stored_rows(root)
    tables = {table: read(open_table(root, table), table) for table in DELTA_TABLES}
    for table in DELTA_TABLES:
        shutil.rmtree(root / table, ignore_errors=True)
        (root / table).mkdir()  # a version-2 writer made the directories, empty until written
    shutil.rmtree(root / "log", ignore_errors=True)  # empty at rest (a version-1 store had none)
    for sid, rows in completions.items():
        if version == 1:
            write_part(root, sid, rows.select(V1_SCHEMA.names).cast(V1_SCHEMA))
        else:
            _write_dead_gateways(root, sid, rows)
    write_sessions(root, tables["sessions"], V1_SESSIONS if version == 1 else V2_SESSIONS)
    for table, write in WRITE_OLD.items():
        write(root, tables[table])
    (root / "VERSION").write_text(f"{version}\n")


def _full_rows(root: Path) -> dict[str, pa.Table]:
    """Every session's full rows (version 1 stored no compact form), by session."""
    reader = StoreReader(root)
    return reader.completions_of(reader.session_ids(), V1_SCHEMA.names)


def stored_rows(root: Path) -> dict[str, pa.Table]:
    """Every session's stored (compact) rows in seq order, by session."""
    rows = stored_completions(root, None, V2_COMPLETIONS.names).sort_by([("session_id", "ascending"),
                                                                          ("seq", "ascending")])
    sids = rows.column("session_id").to_pylist()
    return {sid: rows.slice(sids.index(sid), sids.count(sid)) for sid in dict.fromkeys(sids)}


def _write_dead_gateways(root: Path, sid: str, rows: pa.Table) -> None:
    """One session's n stored rows as a version-2 gateway killed while compacting left them: `part-<k>`
    (k = n // 2), the per-call file of seq 0 that part superseded, the per-call file of seq k, and the log
    holding the rest of the calls plus seq k - 1 (its segment not yet deleted though the part covers it).
    One call: only in the log."""
    n, k = rows.num_rows, rows.num_rows // 2
    superseded, past_part = ([0] if k else []), ([k] if n - k >= 2 else [])
    if k:
        write_part(root, sid, rows.slice(0, k))
    for seq in superseded + past_part:
        write_per_call(root, rows.slice(seq, 1))
    covered = [k - 1] if k else []
    append_log(root, rows.take(covered + list(range(k + len(past_part), n))))


def _session_dir(root: Path, sid: str) -> Path:
    directory = root / "completions" / f"session_id={sid}"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def write_part(root: Path, sid: str, rows: pa.Table) -> Path:
    """`completions/session_id=<sid>/part-<n>.parquet`: the session's seqs 0..n-1."""
    path = _session_dir(root, sid) / f"part-{rows.num_rows}.parquet"
    pq.write_table(rows, path)
    return path


def write_per_call(root: Path, row: pa.Table) -> Path:
    """`completions/session_id=<sid>/<seq:08d>-<completion id>.parquet`: one call."""
    (sid,), (seq,), (cid,) = (row.column(name).to_pylist() for name in ("session_id", "seq", "completion_id"))
    path = _session_dir(root, sid) / f"{seq:08d}-{cid}.parquet"
    pq.write_table(row, path)
    return path


def append_log(root: Path, rows: pa.Table, writer_id: str = DEAD_WRITER) -> Path:
    """Stored rows appended to a writer's first log segment, `log/<writer-id>-000000.jsonl`."""
    path = root / "log" / f"{writer_id}-000000.jsonl"
    path.parent.mkdir(exist_ok=True)
    with open(path, "ab") as segment:
        segment.writelines(encode_line(row) for row in rows.cast(V2_COMPLETIONS).to_pylist())
    return path


def write_sessions(root: Path, rows: pa.Table, schema: pa.Schema = V2_SESSIONS) -> None:
    """`sessions/session_id=<sid>/session.parquet`: each session's row, in `schema`."""
    for (sid,), group in _groups(rows, "session_id").items():
        _write(root / "sessions" / f"session_id={sid}" / "session.parquet", group.select(schema.names).cast(schema))


def _write_rewards(root: Path, rows: pa.Table) -> None:
    """`rewards/session_id=<sid>/<evaluator>.parquet`."""
    for (sid, evaluator), group in _groups(rows, "session_id", "evaluator").items():
        _write(root / "rewards" / f"session_id={sid}" / f"{evaluator}.parquet", group)


def _write_trajectories(root: Path, rows: pa.Table) -> None:
    """`trajectories/builder=<b>/session_id=<sid>/part-0.parquet`."""
    for (builder, sid), group in _groups(rows, "builder", "session_id").items():
        _write(root / "trajectories" / f"builder={builder}" / f"session_id={sid}" / "part-0.parquet", group)


def _write_rollouts(root: Path, rows: pa.Table) -> None:
    """`rollouts/task_id=<id>/task.json`: the task's request and result."""
    for row in rows.to_pylist():
        path = root / "rollouts" / f"task_id={row['task_id']}" / "task.json"
        path.parent.mkdir(parents=True)
        body = {"request": json.loads(row["request_json"]), "result": json.loads(row["result_json"])}
        path.write_text(json.dumps(body, indent=1))


WRITE_OLD = {"rewards": _write_rewards, "trajectories": _write_trajectories, "rollouts": _write_rollouts}


def _groups(rows: pa.Table, *keys: str) -> dict[tuple[str, ...], pa.Table]:
    """The rows split by the values of `keys`."""
    groups: dict[tuple[str, ...], list[dict]] = {}
    for row in rows.to_pylist():
        groups.setdefault(tuple(row[key] for key in keys), []).append(row)
    return {key: pa.Table.from_pylist(group, schema=rows.schema) for key, group in groups.items()}


def _write(path: Path, rows: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows, path)
