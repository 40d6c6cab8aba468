"""Harness presets by name (`AgentSpec.harness`)."""

from __future__ import annotations

from tracetap.rollout.harnesses.base import Harness

HARNESSES: dict[str, Harness] = {}
