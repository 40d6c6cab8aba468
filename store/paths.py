"""Where every file of the store lives (DESIGN §5), and the ids that become path parts.

Session ids, completion ids, builder and evaluator names all end up in file or directory names, so
each is checked against one strict pattern before any path is built, and every built path is
checked to stay under the store root.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import overload

from tracetap.store.location import ObjectPath, StorePath, list_names, store_path

SESSION_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
SEGMENT_NAME = re.compile(r"^([A-Za-z0-9]+)-(\d{6,})\.jsonl$")
LIVE_NAME = re.compile(r"^([A-Za-z0-9]+)\.sessions\.parquet$")
VERSION_FILE = "VERSION"
LOG_DIR = "log"


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


def segment_writer(path: StorePath | str) -> str | None:
    """The id of the writer a log segment belongs to (None for another file)."""
    match = SEGMENT_NAME.fullmatch(str(path).rpartition("/")[2])
    return match.group(1) if match else None


def live_writer(path: StorePath | str) -> str | None:
    """The id of the writer a live file belongs to (None for another file)."""
    match = LIVE_NAME.fullmatch(str(path).rpartition("/")[2])
    return match.group(1) if match else None


def live_file(root: StorePath, writer_id: str) -> StorePath:
    """A writer's live session rows (store/live_sessions.py): `log/<writer-id>.sessions.parquet`."""
    segment_name(writer_id, 0)  # checks the id
    return store_path(root) / LOG_DIR / f"{writer_id}.sessions.parquet"


def live_files(root: StorePath | str) -> list[StorePath]:
    """Every writer's live session rows file."""
    directory = store_path(root) / LOG_DIR
    return [directory / name for name in _listed(directory) if LIVE_NAME.match(name)]
