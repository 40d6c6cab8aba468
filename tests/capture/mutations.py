"""Hypothesis strategies that break valid request bodies the way a fuzzer or a buggy client does.

A mutated body is a seed with one to three edits at random places: a value replaced by a wrong type,
null, a huge or tiny number, an unhashable value, a string where an object was, deep nesting, or a
lone surrogate; a key deleted; or a value wrapped in a list or an object.
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck
from hypothesis import strategies as st
from request_seeds import ENDPOINTS

LONE_SURROGATES = ("\ud800", "a\udfffb")
# Hypothesis settings every fuzz test shares: the same examples on every run, no timing, no database.
FIXED = {"derandomize": True, "database": None, "deadline": None,
         "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}


def nested(depth: int) -> list | dict:
    """`depth` arrays and objects inside each other."""
    value: list | dict = []
    for level in range(depth - 1):
        value = {"k": value} if level % 2 else [value]
    return value


def _scalars(surrogates: bool) -> st.SearchStrategy:
    texts = st.text(max_size=6) | st.sampled_from(["user", "text", "function", "image/png", ""])
    odd = [st.none(), st.booleans(), texts,
           st.integers(-(2**70), 2**70) | st.sampled_from([0, -1, 2**63, 10**300]),
           st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1.5, -0.0, 1e308])]
    if surrogates:
        odd.append(st.sampled_from(LONE_SURROGATES))
    return st.one_of(odd)


def values(surrogates: bool = True) -> st.SearchStrategy:
    """Values to put where something else was."""
    shapes = st.sampled_from([["user"], {}, [], [{}], [None], {"type": [{}]}, {"type": None}, {"text": None}])
    deep = st.integers(2, 80).map(nested)
    keys = st.sampled_from(["type", "text", "role", "name", "x"])
    scalars = _scalars(surrogates)
    small = (st.lists(scalars, max_size=3) | st.dictionaries(keys, scalars, max_size=3)
             | st.lists(st.dictionaries(keys, scalars, max_size=2), max_size=2))
    return st.one_of(_scalars(surrogates), shapes, deep, small).map(copy.deepcopy)


def _places(body: object) -> list[tuple]:
    """Every path to a value inside `body` (keys and indexes), found without recursion."""
    found, pending = [], [((), body)]
    while pending:
        path, node = pending.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            found.append((*path, key))
            pending.append(((*path, key), child))
    return found


def _edit(body: dict, path: tuple, action: str, value: object) -> None:
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    if action == "delete":
        del parent[key]
    elif action == "wrap":
        parent[key] = [parent[key]] if isinstance(value, list) else {"x": parent[key]}
    else:
        parent[key] = value


@st.composite
def mutated(draw: st.DrawFn, seeds: tuple[dict, ...], surrogates: bool = True) -> dict:
    """A copy of one of `seeds` with one to three edits."""
    body = copy.deepcopy(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 3))):
        places = _places(body)
        if not places:
            break
        path = draw(st.sampled_from(places))
        action = draw(st.sampled_from(["replace", "replace", "replace", "delete", "wrap"]))
        _edit(body, path, action, draw(values(surrogates)))
    return body


def every_endpoint(surrogates: bool = True) -> st.SearchStrategy:
    """(endpoint, mutated body) pairs over all the endpoints of request_seeds."""
    return st.one_of([st.tuples(st.just(e), mutated(e.seeds, surrogates)) for e in ENDPOINTS])
