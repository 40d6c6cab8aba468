"""Request bodies as strict JSON with bounded nesting, so nothing downstream recurses without bound.

Python's `json` accepts `NaN`, `Infinity` and numbers like `1e999` (read as infinity); none of them is
JSON, strict readers of the store reject them, and no provider API takes them. Real harness bodies
nest less than 20 containers deep (Claude Code's tool schemas are the deepest), so `MAX_DEPTH` leaves
ample room while keeping redaction, serialization and schema checks far from Python's recursion limit.
"""

from __future__ import annotations

import json
import math
from itertools import compress, repeat

MAX_DEPTH = 64
CONTAINERS = (dict, list)


class BodyError(ValueError):
    """The body is not strict JSON, or nests deeper than MAX_DEPTH."""


def parse_body(raw: bytes | str) -> object:
    """The parsed body; raises BodyError on anything that is not strict, bounded JSON."""
    try:
        value = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise BodyError(_too_deep()) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BodyError(f"request body is not valid JSON: {exc}") from None
    check_depth(value)
    return value


def check_depth(value: object, limit: int = MAX_DEPTH) -> None:
    """Raises BodyError when arrays and objects nest deeper than `limit` (walked level by level, without
    recursion; only containers are queued, picked out in C by `compress`, so an upstream answer's 20k
    prompt ids cost ~1 ms)."""
    level = [value] if isinstance(value, CONTAINERS) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            raise BodyError(_too_deep(limit))
        below: list[dict | list] = []
        for node in level:
            children = list(node.values()) if isinstance(node, dict) else node
            below.extend(compress(children, map(isinstance, children, repeat(CONTAINERS))))
        level = below


def _too_deep(limit: int = MAX_DEPTH) -> str:
    return f"request body nests arrays and objects deeper than {limit} levels"


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is out of range for a JSON number")
    return number
