"""A flood of one log line becomes at most LINES_PER_KIND lines per interval and one summary line."""

from __future__ import annotations

import logging

import pytest
from tracetap.capture.log_limits import SUMMARY, LogLimit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def limited(caplog):
    """A LogLimit on pytest's capturing handler, on a clock the test moves."""
    clock = Clock()
    limit = LogLimit(lines=3, interval=10.0, clock=clock)
    caplog.handler.addFilter(limit)
    caplog.set_level(logging.WARNING)
    yield limit, clock, caplog
    caplog.handler.removeFilter(limit)


def flood(count: int, name: str = "tracetap.test") -> None:
    for i in range(count):
        logging.getLogger(name).warning("connection %d failed", i)  # one call site: one kind


def test_a_flood_lets_a_few_lines_through_then_reports_how_many_it_held_back(limited):
    limit, clock, caplog = limited
    flood(1000)
    assert [r.getMessage() for r in caplog.records] == [f"connection {i} failed" for i in range(3)]
    limit.report()
    [summary] = caplog.records[3:]
    assert summary.name == SUMMARY.name
    assert summary.getMessage() == "997 more log lines like this were held back: connection %d failed"
    limit.report()
    assert len(caplog.records) == 4  # nothing held back since


def test_each_call_site_has_its_own_allowance_and_it_comes_back_after_the_interval(limited):
    limit, clock, caplog = limited
    flood(5)
    flood(5, "tracetap.other")
    assert len(caplog.records) == 6
    clock.now = 10.0
    flood(5)
    assert len(caplog.records) == 9
