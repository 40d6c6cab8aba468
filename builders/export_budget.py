"""The export token budget: prompt + response must fit in `max_tokens`.

The response is clipped to its causal prefix (its first tokens, with their mask and logprobs), so
what remains is exactly what the model saw and sampled. The prompt is never trimmed: cutting it
from the left would change every logprob after it. A trace whose prompt alone fills the budget
(no room for a single response token) is dropped and counted by the caller.
"""

from __future__ import annotations

from tracetap.builders.rewards import add_metadata


def _length(values) -> int:
    return 0 if values is None else len(values)


def apply_budget(trace: dict, max_tokens: int | None) -> dict | None:
    """The trace fitted to `max_tokens` (unchanged when it fits or no budget), or None to drop it."""
    if max_tokens is None:
        return trace
    prompt = _length(trace.get("prompt_token_ids"))
    response = _length(trace.get("response_token_ids"))
    if prompt >= max_tokens:
        return None
    room = max_tokens - prompt
    if response <= room:
        return trace
    logprobs = trace.get("response_logprobs")
    clipping = {"max_tokens": max_tokens, "response_length": response, "kept": room}
    return {
        **trace,
        "response_token_ids": trace["response_token_ids"][:room],
        "loss_mask": trace["loss_mask"][:room],
        "response_logprobs": None if logprobs is None else logprobs[:room],
        "metadata_json": add_metadata(trace.get("metadata_json"), token_clipping=clipping),
    }

