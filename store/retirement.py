"""Files a writer's compaction superseded, deleted a grace period later instead of at once.

A reader lists a session's files, then opens them; a delete in between fails its read, which starts
over from a fresh listing (store/reading.py). Under a writer that compacts often, a long read (a SQL
statement over many sessions opens every listed file) could lose that race on every attempt. The
visibility rule (store/snapshot.py) hides superseded files as soon as the new part is renamed in, so
keeping them a while costs only disk: a read that listed them before the switch can still open them for
`grace` seconds. The writer's close deletes whatever is still waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from tracetap.store.background import BackgroundThread
from tracetap.store.compaction import remove_now
from tracetap.store.location import StorePath

GRACE_SECONDS = 30.0

log = logging.getLogger(__name__)


class Retirement(BackgroundThread):
    """Deletes files `grace` seconds after `later` is told about them, on a thread of its own; `close()`
    deletes every file still waiting, now."""

    def __init__(self, grace: float = GRACE_SECONDS) -> None:
        super().__init__("tracetap-retirement")
        self.grace = grace
        self._due: dict[str, tuple[float, StorePath]] = {}  # path -> (when, its directory), first deadline kept

    def later(self, paths: Sequence[str | StorePath], directory: StorePath) -> None:
        """Delete `paths` (files of `directory`) once the grace period is over; at once when closed."""
        when = time.monotonic() + self.grace
        with self._cond:
            deferred = self.grace > 0 and not self._closed
            if deferred:
                for path in paths:
                    self._due.setdefault(str(path), (when, directory))
                self._start()
                self._cond.notify_all()
        if not deferred:
            _delete([(str(path), directory) for path in paths])

    def waiting(self, path: str | StorePath) -> bool:
        """Whether `path` is retired already and only waits out its grace."""
        with self._cond:
            return str(path) in self._due

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (wait := self._next_due() - time.monotonic()) > 0:
                    self._cond.wait(None if wait == float("inf") else wait)
                now = time.monotonic()
                due = [(path, directory) for path, (when, directory) in self._due.items()
                       if self._closed or when <= now]
                for path, _ in due:
                    del self._due[path]
                closed = self._closed
            _delete(due)
            if closed:
                return

    def _next_due(self) -> float:
        return min((when for when, _ in self._due.values()), default=float("inf"))


def _delete(files: list[tuple[str, StorePath]]) -> None:
    """Delete the files, a directory at a time (compaction.remove_now: then that directory is synced)."""
    by_directory: dict[StorePath, list[str]] = {}
    for path, directory in files:
        by_directory.setdefault(directory, []).append(path)
    for directory, paths in by_directory.items():
        try:
            remove_now(paths, directory)
        except OSError:  # what is left is still superseded: a later compaction hands it over again
            log.exception("could not delete superseded files in %s", directory)
