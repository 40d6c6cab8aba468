"""How every read survives a gateway appending to the store and compacting it meanwhile.

Compaction (store/compaction.py) renames a part file in, then deletes the files it merged, so a
reader may list a file that is gone when it opens it. Every read runs through `retrying`: a read
that lost a file it had listed starts over from a fresh listing (store/snapshot.py), so its answer
is the store as of one listing (no row twice, none missing), never a mix.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
from tracetap.store.files import read_parquet
from tracetap.store.schema import COMPLETIONS
from tracetap.store.snapshot import session_files

ATTEMPTS = 10
FIRST_BACKOFF = 0.002  # seconds before the second attempt, doubled for each next one (~1 s in all)

T = TypeVar("T")


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


def read_session(directory: Path, columns: list[str] | None = None) -> pa.Table:
    """One session's completions (unordered) as of one listing, whatever compaction does meanwhile."""
    return retrying(lambda: read_parquet(list(session_files(directory).files), COMPLETIONS, columns))
