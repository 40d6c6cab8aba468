"""Where every file of the store lives (DESIGN §5), and the ids that become path parts.

Session ids, completion ids, builder and evaluator names all end up in file or directory names, so
each is checked against one strict pattern before any path is built, and every built path is
checked to stay under the store root.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import overload

from tracetap.store.location import ObjectPath, StorePath, list_names, store_path

SESSION_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
LOOSE_NAME = re.compile(r"^(\d{8,})-(.+)\.parquet$")
PART_NAME = re.compile(r"^part-(\d+)\.parquet$")
SEGMENT_NAME = re.compile(r"^([A-Za-z0-9]+)-(\d{6,})\.jsonl$")
VERSION_FILE = "VERSION"
LOG_DIR = "log"
TABLE_DEPTH = {"completions": 1, "sessions": 1}  # tables of per-session files (the others: store/delta.py)


class InvalidSessionId(ValueError):
    """A session id that does not match SESSION_ID_PATTERN."""


def _check_id(value: object, what: str, error: type[ValueError] = ValueError) -> str:
    # fullmatch: `$` alone would accept a trailing newline
    if not isinstance(value, str) or not SESSION_ID_PATTERN.fullmatch(value):
        raise error(f"invalid {what} {value!r}: must match {SESSION_ID_PATTERN.pattern}")
    return value


def validate_session_id(sid: object) -> str:
    """Return `sid` unchanged when it is safe as a directory name, else raise InvalidSessionId."""
    return _check_id(sid, "session id", InvalidSessionId)


def validate_name(value: object, what: str) -> str:
    """Same rule for other ids that become path parts (completion ids, builders, evaluators)."""
    return _check_id(value, what)


def validate_filename(name: object) -> str:
    """A data file name readers will see: a safe id ending in `.parquet`."""
    if not isinstance(name, str) or not name.endswith(".parquet"):
        raise ValueError(f"invalid file name {name!r}: must end in .parquet")
    return _check_id(name, "file name")


@overload
def _under(root: Path, *parts: str) -> Path: ...
@overload
def _under(root: ObjectPath, *parts: str) -> ObjectPath: ...
@overload
def _under(root: StorePath, *parts: str) -> StorePath: ...
def _under(root: StorePath, *parts: str) -> StorePath:
    if isinstance(root, ObjectPath):
        return root.joinpath(*parts)  # each part is checked to be one plain key part
    path = Path(root).joinpath(*parts)
    if not path.resolve().is_relative_to(Path(root).resolve()):
        raise InvalidSessionId(f"path {path} escapes the store root {root}")
    return path


def grant_file(root: StorePath, kind: str, name: str) -> StorePath:
    """`grants/<kind>/<name>` (store/grants.py); callers validate `name`."""
    return _under(root, "grants", kind, name)


def session_of(directory: StorePath | str) -> tuple[StorePath, str]:
    """(store root, session id) of a `completions/session_id=<sid>` directory."""
    directory = store_path(directory)
    return directory.parent.parent, directory.name.removeprefix("session_id=")


@overload
def session_dir(root: Path, table: str, sid: str, builder: str | None = None) -> Path: ...
@overload
def session_dir(root: ObjectPath, table: str, sid: str, builder: str | None = None) -> ObjectPath: ...
@overload
def session_dir(root: StorePath, table: str, sid: str, builder: str | None = None) -> StorePath: ...
def session_dir(root: StorePath, table: str, sid: str, builder: str | None = None) -> StorePath:
    """`<table>/session_id=<sid>` (trajectories: `trajectories/builder=<b>/session_id=<sid>`)."""
    part = f"session_id={validate_session_id(sid)}"
    if table == "trajectories":
        return _under(root, table, f"builder={validate_name(builder, 'builder')}", part)
    if table not in TABLE_DEPTH:
        raise ValueError(f"unknown table {table!r}")
    return _under(root, table, part)


def completion_name(seq: int, completion_id: str) -> str:
    return f"{seq:08d}-{validate_name(completion_id, 'completion id')}.parquet"


def part_name(covered: int) -> str:
    """A compacted file; `covered` is how many seqs (0..covered-1) it holds, see compaction."""
    return f"part-{covered}.parquet"


def segment_name(writer_id: str, number: int) -> str:
    """A group-commit log segment: `<writer-id>-<number:06d>.jsonl` (see store/commit_log.py)."""
    if not re.fullmatch(r"[A-Za-z0-9]+", validate_name(writer_id, "writer id")):
        raise ValueError(f"invalid writer id {writer_id!r}: letters and digits only")
    return f"{writer_id}-{number:06d}.jsonl"


def _listed(directory: StorePath) -> list[str]:
    """The sorted entry names of a directory, none when it is missing."""
    try:
        return sorted(list_names(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []


def log_segments(root: StorePath | str) -> list[StorePath]:
    """The store's log segments, oldest first within each writer (temp and hidden names skipped)."""
    directory = store_path(root) / LOG_DIR
    return [directory / name for name in _listed(directory) if SEGMENT_NAME.match(name)]


def session_file(root: StorePath, sid: str) -> StorePath:
    return session_dir(root, "sessions", sid) / "session.parquet"


def data_files(directory: StorePath | str) -> list[str]:
    """Complete data files in one partition directory (hidden and temp names skipped), sorted.

    Paths as strings (URLs on an object store): readers list thousands of them per statement, and a
    string costs far less to make than a Path (DuckDB and pyarrow take either)."""
    try:
        names = list_names(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    prefix = f"{directory}/"
    return [prefix + name for name in sorted(names) if name.endswith(".parquet") and not name.startswith(".")]


def loose_seq(path: Path | str) -> int | None:
    """The seq in a per-completion file name, or None for any other file."""
    match = LOOSE_NAME.match(os.path.basename(path))
    return int(match.group(1)) if match else None


def part_covered(path: Path | str) -> int | None:
    """How many seqs a part file covers, or None when it is not a part file."""
    match = PART_NAME.match(os.path.basename(path))
    return int(match.group(1)) if match else None


def classify(directory: StorePath | str) -> tuple[dict[int, str], dict[int, str]]:
    """(part files by how many seqs they cover, per-completion files by seq) in one session directory."""
    parts, loose = {}, {}
    for path in data_files(directory):
        if (covered := part_covered(path)) is not None:
            parts[covered] = path
        elif (seq := loose_seq(path)) is not None:
            loose[seq] = path
    return parts, loose
