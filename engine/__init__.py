"""The embedded CPU engine: vLLM's OpenAI-compatible API over the real Qwen3 tokenizer and a tiny model.

A stand-in for a served model in development, tests and the demo (never a claim about model quality).
Importing it is cheap; torch and transformers load when the server starts.
"""

from tracetap.engine.server import EngineServer

__all__ = ["EngineServer"]
