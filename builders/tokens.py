"""Token-level helpers for the builders: prefix tests, generation-prompt stripping, end-of-turn detection.

Token lists are numpy int32 arrays here: the builders compare long prompts many times per session,
and numpy does that at memory speed over Arrow buffers without copying them into Python ints.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np

# A trailing generation prompt (`<|im_start|>assistant\n`, plus an empty think block on some
# templates) is at most this many tokens; the search for its start looks no further back.
GENERATION_PROMPT_MAX = 16
# `<|im_end|>` of ChatML (Qwen): the end-of-turn id used when nothing better is known and the
# served model is a Qwen model (see detect_eot).
QWEN_IM_END = 151645
NATURAL_STOPS = ("stop", "tool_calls", "stop_sequence", "end_turn")
STOP_STRING = re.compile(r'"stop_reason"\s*:\s*"')  # a body without it has no string stop_reason anywhere


def ids(values) -> np.ndarray:
    """Any list of token ids as an int32 array (no copy when it already is one)."""
    return np.asarray(values if values is not None else (), dtype=np.int32)


def is_prefix(prefix: np.ndarray, tokens: np.ndarray) -> bool:
    """True when `tokens` starts with the non-empty `prefix`."""
    n = len(prefix)
    return 0 < n <= len(tokens) and bool(np.array_equal(tokens[:n], prefix))


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two id arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def find_first(tokens: np.ndarray, token: int) -> int:
    """Index of the first `token` in `tokens`, or -1."""
    hits = np.flatnonzero(tokens == token)
    return int(hits[0]) if len(hits) else -1


def strip_generation_prompt(prompt: np.ndarray) -> np.ndarray:
    """The prompt without its trailing generation prompt; unchanged when none is found.

    The generation prompt opens a turn with the same token the prompt starts with (`<|im_start|>`
    in ChatML), so it is the span from the last occurrence of that token, if that span is short.
    """
    if len(prompt) < 2:
        return prompt
    window_start = max(1, len(prompt) - GENERATION_PROMPT_MAX)
    hits = np.flatnonzero(prompt[window_start:] == prompt[0])
    return prompt[: window_start + int(hits[-1])] if len(hits) else prompt


def generation_prompt_block(tip: np.ndarray, prompt: np.ndarray) -> int:
    """Length of the block at the end of `tip`'s generation prompt that `prompt` leaves out; else 0.

    With thinking disabled a template (Qwen3's, ours) renders `<|im_start|>assistant\n` plus an empty
    `<think>\n\n</think>\n\n` for the turn to come, but re-renders past assistant turns without it,
    so the turn's copy in the next prompt starts inside the tip's generation prompt. Detected from the
    ids alone: `prompt` shares the tip up to a point inside its generation prompt, past the turn
    opener and the role after it (a prompt that opens another role there dropped the turn instead),
    and ends with that same generation prompt (the template added the block again).
    """
    opening = len(strip_generation_prompt(tip))
    glue = tip[opening:]
    shared = common_prefix_len(tip, prompt)
    if not opening + 2 <= shared < len(tip) or len(prompt) < shared + len(glue):
        return 0
    return len(tip) - shared if np.array_equal(prompt[len(prompt) - len(glue):], glue) else 0


def shared_tokens(a: np.ndarray, b: np.ndarray) -> int:
    """How many tokens two id arrays have in common, as multisets (order-free, so a local
    re-tokenization or a stripped reasoning block costs little)."""
    return sum((Counter(a.tolist()) & Counter(b.tolist())).values())


def _stopped_on_token(chat_response_json: str | None) -> bool:
    """False when the upstream says a stop *string* ended the turn (its last id is then plain text)."""
    if not STOP_STRING.search(chat_response_json or ""):  # most bodies: no need to parse them
        return True
    try:
        choice = json.loads(chat_response_json or "{}").get("choices", [{}])[0]
    except (ValueError, AttributeError, IndexError, TypeError):
        return True
    return not isinstance(choice, dict) or not isinstance(choice.get("stop_reason"), str)


def detect_eot(rows: list[dict]) -> int | None:
    """The end-of-turn id a model emits when it stops by itself, from a session's ok completions.

    Candidates are the last sampled id of each naturally stopped completion (stop strings excluded);
    the most frequent wins, the earliest on a tie. None when no completion stopped naturally.
    """
    votes: Counter[int] = Counter()
    for row in rows:
        sampled = row.get("completion_token_ids")
        natural = row.get("status") == "ok" and row.get("finish_reason") in NATURAL_STOPS
        on_token = _stopped_on_token(row.get("chat_response_json"))
        if natural and on_token and sampled is not None and len(sampled):
            votes[int(sampled[-1])] += 1
    return votes.most_common(1)[0][0] if votes else None


def resolve_eot(rows: list[dict], eot_id: int | None) -> tuple[int | None, str | None]:
    """(end-of-turn id, where it came from): configured, else detected, else Qwen's for Qwen models."""
    if eot_id is not None:
        return int(eot_id), "configured"
    detected = detect_eot(rows)
    if detected is not None:
        return detected, "detected"
    if any("qwen" in str(row.get("served_model") or "").lower() for row in rows):
        return QWEN_IM_END, "qwen_default"
    return None, None
