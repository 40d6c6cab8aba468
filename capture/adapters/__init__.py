"""The provider adapters, by the API name the store records (`completions.api`).

Adding an API is one line in `_MODULES`. A module that is not there yet (adapters are built in
parallel) is skipped, so the gateway answers its paths with a 404 until it lands; a module that is
there but fails to import still raises.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

_MODULES = {
    "openai_chat": "openai_chat",
    "anthropic_messages": "anthropic",
    "openai_responses": "openai_responses",
    "gemini": "gemini",
}


def _load() -> dict[str, ModuleType]:
    found = {api: f"{__name__}.{module}" for api, module in _MODULES.items()}
    return {api: importlib.import_module(name) for api, name in found.items()
            if importlib.util.find_spec(name) is not None}


ADAPTERS: dict[str, ModuleType] = _load()
