"""Version 2's completions, read back as that version showed them, for `tracetap migrate` alone.

Up to version 2 a session's completions were a directory, `completions/session_id=<sid>/`, of a part file
`part-<n>.parquet` holding seqs 0..n-1 and per-call files `<seq:08d>-<id>.parquet`, plus the session's rows
in the group-commit log. A reader showed the highest part, the per-call files with seq >= n, and the log
rows past both. Version 1 stored whole rows; `to_current` gives any version's rows in the compact form.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from tracetap.store.compact_form import History, encode_row
from tracetap.store.expansion import expand
from tracetap.store.files import read_parquet
from tracetap.store.log_reading import log_rows
from tracetap.store.paths import SESSION_ID_PATTERN
from tracetap.store.schema import STORED_COMPLETIONS
from tracetap.store.tables import rows_to_table

PART = re.compile(r"part-(\d+)\.parquet")
PER_CALL = re.compile(r"(\d{8,})-.+\.parquet")
PARTITION = "session_id="


def visible_files(directory: Path) -> list[Path]:
    """The files version 2 showed of one session: its highest part, then the per-call files past it."""
    parts = {int(m.group(1)): path for path in directory.glob("part-*.parquet") if (m := PART.fullmatch(path.name))}
    per_call = {int(m.group(1)): path for path in directory.glob("*.parquet") if (m := PER_CALL.fullmatch(path.name))}
    covered = max(parts, default=0)
    return ([parts[covered]] if parts else []) + [path for seq, path in sorted(per_call.items()) if seq >= covered]


def to_current(table: pa.Table) -> pa.Table:
    """One session's rows (any version) in the current stored form."""
    full = expand(table, STORED_COMPLETIONS.names)
    history = History()
    return rows_to_table("completions", [encode_row(history, row) for row in full.to_pylist()])


def session_ids(directory: Path, logged: pa.Table) -> list[str]:
    """The sessions of an old completions tree and of the log, sorted."""
    in_tree = {path.name.removeprefix(PARTITION) for path in directory.glob(f"{PARTITION}*") if path.is_dir()}
    in_log = set(logged.column("session_id").to_pylist())
    return sorted(sid for sid in in_tree | in_log if SESSION_ID_PATTERN.fullmatch(sid))


def session_rows(directory: Path, sid: str, logged: pa.Table) -> pa.Table:
    """One session's rows as version 2 showed them (the log rows past its files), in the current form."""
    stored = read_parquet(visible_files(directory / f"{PARTITION}{sid}"), STORED_COMPLETIONS)
    seen = set(stored.column("seq").to_pylist())
    mine = logged.filter(pc.field("session_id") == sid)
    past = mine.filter(pa.array([seq not in seen for seq in mine.column("seq").to_pylist()], pa.bool_()))
    return to_current(pa.concat_tables([stored, past]))


def all_sessions(directory: Path, root: Path) -> Iterator[tuple[str, pa.Table]]:
    """(session id, its rows) for every session of the old tree at `directory` and of the store's log."""
    logged = log_rows(root)
    for sid in session_ids(directory, logged):
        yield sid, session_rows(directory, sid, logged)
