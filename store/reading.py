"""How every reader lists and reads the store while a gateway appends to it and compacts it.

Compaction (store/compaction.py) renames a part file in, then deletes the files it merged. So a
reader may list a file that is gone when it opens it, and a listing of a large directory taken while
compaction runs may miss files (a directory read in several system calls is no snapshot). The rule:

- a completions directory is listed with `session_files`: compaction's visibility rule, checked to
  cover seqs 0..n-1 without a hole and to show no file deleted since. Compaction deletes in seq order,
  oldest part first, so a listing that missed a merged file either shows one deleted since or has a
  hole; it is then taken again. A hole two identical listings agree on is the store's own: read as is.
- every read runs through `retrying`: a read that lost a file it had listed starts over from a fresh
  listing, so its answer is the store as of one listing (no row twice, none missing), never a mix.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
from tracetap.store.compaction import live_files
from tracetap.store.expansion import expand, inputs
from tracetap.store.files import read_parquet
from tracetap.store.log_reading import log_rows
from tracetap.store.paths import loose_seq, part_covered
from tracetap.store.schema import COMPLETIONS, STORED_COMPLETIONS

ATTEMPTS = 8
FIRST_BACKOFF = 0.01  # seconds before the second attempt, doubled for each next one

T = TypeVar("T")


class ListingRaced(FileNotFoundError):
    """A directory kept changing under every listing of it (compaction ran through each one)."""


def file_vanished(error: BaseException) -> bool:
    """Whether `error` means a listed file was gone when opened, as a concurrent compaction causes."""
    return isinstance(error, FileNotFoundError)


def retrying(read: Callable[[], T], vanished: Callable[[BaseException], bool] = file_vanished) -> T:
    """`read()`, run again (from its own fresh listing) while it fails because a listed file vanished."""
    for attempt in range(ATTEMPTS - 1):
        try:
            return read()
        except Exception as error:
            if not vanished(error):
                raise
        time.sleep(FIRST_BACKOFF * 2**attempt)
    return read()


def _without_hole(files: list[Path]) -> bool:
    """Whether the files cover seqs 0..n-1: the head part (if any) then consecutive per-call files."""
    start = part_covered(files[0]) if files and part_covered(files[0]) is not None else 0
    seqs = [seq for seq in map(loose_seq, files) if seq is not None]
    return seqs == list(range(start, start + len(seqs)))


def _settled(files: list[Path]) -> bool:
    """Whether a listing is whole: nothing it shows was deleted since, and its seqs have no hole."""
    return all(path.exists() for path in files) and _without_hole(files)


def session_files(directory: Path) -> list[Path]:
    """The files to read for one completions directory, from a listing that did not race compaction."""
    files = live_files(directory)
    for _ in range(ATTEMPTS):
        if _settled(files):
            return files
        again = live_files(directory)
        if again == files:  # a hole in the store itself: read what is there
            return files
        files = again
    raise ListingRaced(f"{directory} changed during each of {ATTEMPTS} listings")


def visible_log_rows(logged: pa.Table, files: list[Path]) -> pa.Table:
    """The log rows the visibility rule shows next to a listing of data files: in each session, the
    rows with seq >= N, N the session's head part in `files` (0 without one)."""
    covered = {path.parent.name.removeprefix("session_id="): part_covered(path) for path in files
               if part_covered(path) is not None}
    sessions, seqs = logged.column("session_id").to_pylist(), logged.column("seq").to_pylist()
    keep = [seq >= covered.get(sid, 0) for sid, seq in zip(sessions, seqs, strict=True)]
    return logged.filter(pa.array(keep, pa.bool_()))


def _read_session_once(directory: Path, columns: list[str] | None) -> pa.Table:
    # the log is read first: a segment is deleted only after the parts that cover it are in place
    logged = log_rows(directory.parent.parent, directory.name.removeprefix("session_id="))
    files = session_files(directory)
    visible = visible_log_rows(logged, files)
    return pa.concat_tables([read_parquet(files, STORED_COMPLETIONS, columns),
                             visible if columns is None else visible.select(columns)])


def read_session(directory: Path, columns: list[str] | None = None) -> pa.Table:
    """One session's completions, full (store/expansion.py) and in seq order, as of one listing,
    whatever compaction does meanwhile: its data files and its rows in the group-commit log.
    `columns` may name stored compact columns too."""
    wanted = columns if columns is not None else COMPLETIONS.names
    return expand(retrying(lambda: _read_session_once(directory, inputs(wanted))), wanted)
