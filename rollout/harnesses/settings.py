"""`agent.settings` of a CLI preset, checked: a knob the CLI cannot honour is an error, never ignored."""

from __future__ import annotations

import shlex
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

KNOWN = ("max_turns", "reasoning_effort", "extra_flags")


@dataclass(frozen=True)
class CliSettings:
    max_turns: int | None = None
    reasoning_effort: str | None = None
    extra_flags: tuple[str, ...] = ()  # appended to the CLI's flags, before the prompt


def parse_settings(harness: str, settings: Mapping[str, Any], supported: Collection[str]) -> CliSettings:
    """Raises ValueError naming the setting when it is unknown, unsupported by `harness`, or mistyped."""
    for key in settings:
        if key not in supported:
            raise ValueError(f"agent.settings.{key} is not supported by {harness} "
                             f"(supported: {', '.join(k for k in KNOWN if k in supported)})")
    return CliSettings(max_turns=_max_turns(settings.get("max_turns")),
                       reasoning_effort=_effort(settings.get("reasoning_effort")),
                       extra_flags=_flags(settings.get("extra_flags")))


def _max_turns(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"agent.settings.max_turns must be a positive integer, got {value!r}")
    return value


def _effort(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        raise ValueError(f"agent.settings.reasoning_effort must be a word such as 'high', got {value!r}")
    return value.strip()


def _flags(value: object) -> tuple[str, ...]:
    """A list of arguments, or one string split as a shell would."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, list) and all(isinstance(flag, str) for flag in value):
        return tuple(value)
    raise ValueError(f"agent.settings.extra_flags must be a string or a list of strings, got {value!r}")
