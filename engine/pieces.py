"""Non-canonical tokenizations: a turn sampled as other ids than the chat template's own.

Real models do this (vLLM fixture `chat_history`: `<tool_call>` sampled as the text pieces `<`, `tool`,
`_cal`, `l`, `>` where the template writes the one added token 151657). The scripted engine reproduces it
on request so the gateway's token continuity and the builders' drift reports can be tested.
"""

from __future__ import annotations

from tracetap.engine.tokenizer import CONTROL_IDS, ChatTokenizer


def split_ids(ids: list[int], tokenizer: ChatTokenizer) -> list[int]:
    """The same text with every token of two or more characters sampled as two pieces (control tokens,
    the end of turn among them, stay whole: they have no text form)."""
    out: list[int] = []
    for token_id in ids:
        text = tokenizer.decode([token_id])
        if token_id in CONTROL_IDS or len(text) < 2:
            out.append(token_id)
            continue
        middle = len(text) // 2
        out += tokenizer.encode(text[:middle]) + tokenizer.encode(text[middle:])
    return out
