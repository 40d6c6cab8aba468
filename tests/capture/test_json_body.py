"""The strict body parser: its nesting check against a plain recursive count, on random JSON."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracetap.capture.json_body import BodyError, check_depth, parse_body

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=40,
)


def depth(value: object) -> int:
    """Arrays and objects nested in `value`, counted the obvious way."""
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


@settings(max_examples=400, deadline=None)
@given(value=JSON)
def test_the_nesting_check_refuses_exactly_what_nests_past_the_limit(value):
    nesting = depth(value)
    check_depth(value, nesting)  # at the limit: accepted
    if nesting:
        with pytest.raises(BodyError):
            check_depth(value, nesting - 1)
    assert parse_body(json.dumps(value)) == value


@pytest.mark.parametrize("raw", [b"NaN", b"[1e999]", b'{"a": -Infinity}', b"[" * 70 + b"]" * 70])
def test_what_is_not_strict_bounded_json_is_refused(raw):
    with pytest.raises(BodyError):
        parse_body(raw)
