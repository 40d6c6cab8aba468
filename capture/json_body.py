"""Request bodies as strict JSON with bounded nesting, so nothing downstream recurses without bound.

Python's `json` accepts `NaN`, `Infinity` and numbers like `1e999` (read as infinity); none of them is
JSON, strict readers of the store reject them, and no provider API takes them. Real harness bodies
nest less than 20 containers deep (Claude Code's tool schemas are the deepest), so `MAX_DEPTH` leaves
ample room while keeping redaction, serialization and schema checks far from Python's recursion limit.
"""

from __future__ import annotations

import json
import math
from itertools import chain, compress

MAX_DEPTH = 64
_KINDS = frozenset({dict, list})  # what json.loads builds containers of


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
    """Raises BodyError when arrays and objects of parsed JSON (exact dicts and lists) nest deeper than
    `limit`. Walked level by level, without recursion, each level's values gathered and filtered in C
    (`chain`, `compress`): an upstream answer of 4,000 sampled tokens with logprobs and 20k prompt ids
    in ~2 ms, where a Python step per container took ~6."""
    level = [value] if type(value) in _KINDS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            raise BodyError(_too_deep(limit))
        dicts = [node for node in level if type(node) is dict]
        lists = [node for node in level if type(node) is list] if len(dicts) < len(level) else []
        children = list(chain(chain.from_iterable(map(dict.values, dicts)), chain.from_iterable(lists)))
        level = list(compress(children, map(_KINDS.__contains__, map(type, children))))


def _too_deep(limit: int = MAX_DEPTH) -> str:
    return f"request body nests arrays and objects deeper than {limit} levels"


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is out of range for a JSON number")
    return number
