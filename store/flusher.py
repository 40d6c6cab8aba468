"""A background thread that runs deferred saves, coalescing repeated requests for the same key.

The writer uses it for session summary rows: they are derived data (recounted from the completions
on the next load if a crash loses one), so rewriting them need not sit on the gateway's per-call path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from tracetap.store.background import BackgroundThread

log = logging.getLogger(__name__)


K = TypeVar("K", bound=Hashable)


class Flusher(BackgroundThread, Generic[K]):
    """Calls `save(key)` soon after `submit(key)`; many submits of one key before it runs make one save.
    `close()` runs what is pending, then stops the thread."""

    def __init__(self, save: Callable[[K], None], name: str = "tracetap-flusher",
                 delay: float = 0.0) -> None:
        super().__init__(name)
        self._save = save
        self._delay = delay  # how long a batch waits for more submits before it runs
        self._pending: dict[K, None] = {}
        self._busy = False
        self._urgent = False

    def submit(self, key: K) -> None:
        """Schedule `save(key)`; after close() it runs right here instead."""
        with self._cond:
            closed, idle = self._closed, not self._pending
            if not closed:
                self._pending[key] = None
                self._start()
            if idle:  # a thread waiting out the delay needs no wake-up per submit (each costs a GIL hand-off)
                self._cond.notify_all()
        if closed:
            self._save(key)

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
                if self._delay:  # a burst of calls to one session becomes one save
                    self._cond.wait_for(lambda: self._closed or self._urgent, timeout=self._delay)
                if not self._pending:
                    return
                keys, self._pending, self._busy, self._urgent = list(self._pending), {}, True, False
            for key in keys:
                try:
                    self._save(key)
                except Exception:  # the next submit retries; one bad save must not stop the thread
                    log.exception("deferred save of %r failed", key)
            with self._cond:
                self._busy = False
                self._cond.notify_all()
