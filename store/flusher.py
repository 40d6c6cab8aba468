"""A background thread that runs deferred saves in batches, coalescing repeated requests for the same key.

The writer uses it twice: for its live session rows (derived data, recounted from the completions on
the next load if a crash loses one), so rewriting them need not sit on the gateway's per-call path; and
as its compactor, which commits whatever sessions were handed to it meanwhile in one commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from tracetap.store.background import BackgroundThread

log = logging.getLogger(__name__)


K = TypeVar("K", bound=Hashable)


class Flusher(BackgroundThread, Generic[K]):
    """Calls `save(keys)` soon after `submit(key)`, with every key submitted since the last save (many
    submits of one key make one entry). `close()` runs what is pending, then stops the thread."""

    def __init__(self, save: Callable[[list[K]], None], name: str = "tracetap-flusher",
                 delay: float = 0.0) -> None:
        super().__init__(name)
        self._save = save
        self._delay = delay  # how long a batch waits for more submits before it runs
        self._pending: dict[K, None] = {}
        self._busy = False
        self._urgent = False

    def submit(self, key: K) -> None:
        """Schedule `key` for the next save; after close() it is saved right here instead."""
        with self._cond:
            closed, idle = self._closed, not self._pending
            if not closed:
                self._pending[key] = None
                self._start()
            if idle:  # a thread waiting out the delay needs no wake-up per submit (each costs a GIL hand-off)
                self._cond.notify_all()
        if closed:
            self._save([key])

    def flush(self) -> None:
        """Block until every save submitted so far has run."""
        with self._cond:
            self._urgent = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._pending and not self._busy)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if self._delay:  # a burst of calls becomes one save
                    self._cond.wait_for(lambda: self._closed or self._urgent, timeout=self._delay)
                if not self._pending:
                    return
                keys, self._pending, self._busy, self._urgent = list(self._pending), {}, True, False
            try:
                self._save(keys)
            except Exception:  # the next submit retries; one bad save must not stop the thread
                log.exception("deferred save of %r failed", keys)
            with self._cond:
                self._busy = False
                self._cond.notify_all()
