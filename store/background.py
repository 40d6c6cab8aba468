"""A daemon thread for a writer's deferred work (session-row saves, deletions), started on first use."""

from __future__ import annotations

import threading


class BackgroundThread:
    """Subclasses keep their state under `_cond` and implement `_run`, which returns once `_closed` is
    set and what was pending is done."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def _start(self) -> None:
        """Start the thread unless it runs (call with `_cond` held)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Let the thread finish what is pending, then stop it."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        raise NotImplementedError
