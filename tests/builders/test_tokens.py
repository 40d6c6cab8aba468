"""Token helpers: prefix tests, generation-prompt stripping, end-of-turn detection."""

from __future__ import annotations

import json

import pytest
from toychat import EOT, GENERATION_PROMPT, NL, THINKING_OFF, completion
from tracetap.builders.tokens import (
    QWEN_IM_END,
    common_prefix_len,
    detect_eot,
    generation_prompt_block,
    ids,
    is_prefix,
    resolve_eot,
    strip_generation_prompt,
)


@pytest.mark.parametrize(("prefix", "tokens", "expected"), [
    ([1, 2], [1, 2, 3], True),
    ([1, 2, 3], [1, 2, 3], True),
    ([1, 3], [1, 2, 3], False),
    ([1, 2, 3, 4], [1, 2, 3], False),
    ([], [1, 2], False),  # an empty tip matches nothing
])
def test_is_prefix(prefix, tokens, expected):
    assert is_prefix(ids(prefix), ids(tokens)) is expected


@pytest.mark.parametrize(("a", "b", "expected"), [([1, 2, 3], [1, 2, 4], 2), ([1], [1, 2], 1), ([5], [6], 0)])
def test_common_prefix_len(a, b, expected):
    assert common_prefix_len(ids(a), ids(b)) == expected


@pytest.mark.parametrize(("prompt", "expected"), [
    ([1, 4, 3, 10, 2, 3, *GENERATION_PROMPT], [1, 4, 3, 10, 2, 3]),
    ([1, 4, 3, 10, 2, 3], [1, 4, 3, 10, 2, 3]),  # the only opener is the prompt's first token
    ([9, 4, 3, 10, 2, 3, *GENERATION_PROMPT], [9, 4, 3, 10, 2, 3, *GENERATION_PROMPT]),  # no opener again
    ([1, 4, 3, *range(10, 40), 2, 3], [1, 4, 3, *range(10, 40), 2, 3]),  # opener too far back
])
def test_strip_generation_prompt(prompt, expected):
    assert strip_generation_prompt(ids(prompt)).tolist() == expected


@pytest.mark.parametrize(("tip", "prompt", "expected"), [
    # thinking off: the copy of the turn starts inside the tip's generation prompt, the next prompt
    # ends with the same generation prompt
    ([1, 5, 3, 20, *THINKING_OFF], [1, 5, 3, 20, *GENERATION_PROMPT, 30, EOT, NL, *THINKING_OFF], 4),
    ([1, 5, 3, 20, *GENERATION_PROMPT], [1, 5, 3, 20, *GENERATION_PROMPT, 30], 0),  # a plain prefix
    ([1, 5, 3, 20, *THINKING_OFF], [1, 5, 3, 20, *GENERATION_PROMPT, 30, EOT, NL, *GENERATION_PROMPT], 0),
    ([1, 5, 3, 20, *THINKING_OFF], [1, 5, 3, 21, *THINKING_OFF], 0),  # differs before the generation prompt
    ([1, 5, 3, 20], [1, 5, 3, 21, *THINKING_OFF], 0),  # no generation prompt at the tip's end
    # the turn was dropped: another role opens where the assistant turn would be
    ([1, 5, 3, 20, *THINKING_OFF], [1, 5, 3, 20, 1, 5, 3, 21, EOT, NL, *THINKING_OFF], 0),
])
def test_generation_prompt_block(tip, prompt, expected):
    assert generation_prompt_block(ids(tip), ids(prompt)) == expected


def stop_string(row: dict) -> dict:
    return {**row, "chat_response_json": json.dumps({"choices": [{"stop_reason": " Unfortunately"}]})}


@pytest.mark.parametrize(("rows", "expected"), [
    ([completion([1], [5, EOT]), completion([1], [6, EOT], "tool_calls")], EOT),
    ([completion([1], [5, 7], "length"), completion([1], [6, EOT])], EOT),
    ([stop_string(completion([1], [5, 9])), completion([1], [6, EOT])], EOT),  # stop strings skipped
    ([completion([1], [5, EOT]), completion([1], [6, 8]), completion([1], [6, 8])], 8),  # majority
    ([completion([1], [5, 7], "length"), stop_string(completion([1], [5, 9]))], None),
    ([{**completion([1], [5, EOT]), "status": "timeout"}], None),
])
def test_detect_eot(rows, expected):
    assert detect_eot(rows) == expected


@pytest.mark.parametrize(("rows", "eot_id", "expected"), [
    ([completion([1], [5, EOT])], 7, (7, "configured")),
    ([completion([1], [5, EOT])], None, (EOT, "detected")),
    ([completion([1], [5], "length", served_model="Qwen/Qwen3-4B")], None, (QWEN_IM_END, "qwen_default")),
    ([completion([1], [5], "length")], None, (None, None)),
])
def test_resolve_eot(rows, eot_id, expected):
    assert resolve_eot(rows, eot_id) == expected
