"""Rate-limited logging: a flood of one message cannot fill the disk or drown the rest of the log.

Thousands of clients failing the same way (an accept loop out of descriptors, a traceback per refused
connection) log the same line thousands of times. `LogLimit` lets through at most `lines` records of
one kind (one logging call site) per `interval` seconds and counts the others; `report()` then logs one
summary line per kind that was held back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

REPORT_SECONDS = 10.0
LINES_PER_KIND = 10
SUMMARY = logging.getLogger("tracetap.gateway.logs")  # never held back: at most one line per kind per report

_Kind = tuple[str, str, int]  # logger name, file, line: one logging call site


class LogLimit(logging.Filter):
    """A handler filter; thread-safe (the store's threads log too)."""

    def __init__(self, lines: int = LINES_PER_KIND, interval: float = REPORT_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.lines, self.interval, self.clock = lines, interval, clock
        self._windows: dict[_Kind, tuple[float, int]] = {}  # kind -> (window start, records let through)
        self._held: Counter[_Kind] = Counter()
        self._samples: dict[_Kind, str] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == SUMMARY.name:
            return True
        kind, now = (record.name, record.pathname, record.lineno), self.clock()
        with self._lock:
            start, passed = self._windows.get(kind, (now, 0))
            if now - start >= self.interval:
                start, passed = now, 0
            if passed < self.lines:
                self._windows[kind] = (start, passed + 1)
                return True
            self._held[kind] += 1
            self._samples.setdefault(kind, str(record.msg)[:200])
        return False

    def report(self) -> None:
        """One line per kind of record held back since the last report."""
        now = self.clock()
        with self._lock:
            held, samples = self._held, self._samples
            self._held, self._samples = Counter(), {}
            self._windows = {kind: w for kind, w in self._windows.items() if now - w[0] < self.interval}
        for kind, count in held.items():
            SUMMARY.warning("%d more log lines like this were held back: %s", count, samples[kind])


def install(limit: LogLimit) -> LogLimit:
    """Filter every handler of the root logger (records of every logger end there)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(limit)
    return limit
