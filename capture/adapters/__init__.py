"""The provider adapters, by the API name the store records (`completions.api`).

Adding an API is one line in `ADAPTERS` (plus `TOKEN_COUNTERS` / `MODEL_LISTERS` when it has those
endpoints); mypy checks each module against the Protocols of capture/adapters/base.py.
"""

from __future__ import annotations

from tracetap.capture.adapters import anthropic, gemini, openai_chat, openai_responses
from tracetap.capture.adapters.base import Adapter, ModelLister, TokenCounter

ADAPTERS: dict[str, Adapter] = {
    "openai_chat": openai_chat,
    "anthropic_messages": anthropic,
    "openai_responses": openai_responses,
    "gemini": gemini,
}
TOKEN_COUNTERS: dict[str, TokenCounter] = {
    "anthropic_messages": anthropic, "openai_responses": openai_responses, "gemini": gemini,
}
MODEL_LISTERS: dict[str, ModelLister] = {"openai_chat": openai_chat, "gemini": gemini}
