"""Drift spans: every differing region of a turn and its copy, each classified by its decoded text."""

from __future__ import annotations

import pytest
from toychat import decode
from tracetap.builders.drift import turn_drift
from tracetap.builders.tokens import ids

IDS = ("cmpl-a", "cmpl-b")


@pytest.mark.parametrize(("sampled", "copy", "expected"), [
    ([30, 31, 2], [30, 31, 2], []),
    ([30, 31, 2], [90, 2], [("tokenization", (0, 2), (100, 101))]),  # 90 is the text of 30 31
    ([40, 30, 31, 41, 42, 2], [40, 90, 41, 43, 2], [("tokenization", (1, 3), (101, 102)),
                                                    ("content", (4, 5), (103, 104))]),
    ([50, 51, 30, 2], [30, 2], [("content", (0, 2), (100, 100))]),  # thoughts dropped from the copy
    ([30, 2], [30, 60, 2], [("content", (1, 1), (101, 102))]),
])
def test_each_differing_region_is_one_span_of_its_kind(sampled, copy, expected):
    spans = turn_drift(ids(sampled), ids(copy), 100, IDS, decode)
    assert [(s.kind, s.sampled, s.copy) for s in spans] == expected
    assert all((s.completion_id, s.next_completion_id) == IDS for s in spans)


def test_without_decode_changed_ids_are_unknown():
    (span,) = turn_drift(ids([30, 31, 2]), ids([90, 2]), 0, IDS, None)
    assert (span.kind, span.tokens) == ("unknown", 2)
