"""Random agent steps for the builders' property tests: what an agent samples and what happens to
the turn (stop, tool call, cut at `length`, re-rendered, retried, an earlier message rewritten)."""

from __future__ import annotations

from hypothesis import strategies as st
from toychat import Conversation

CONTENT = st.lists(st.integers(10, 97), min_size=0, max_size=6)
RERENDERED, RETRY = 98, 99  # ids only a re-rendered turn / a discarded retry contain


@st.composite
def turns(draw) -> dict:
    """One step of an agent: what it samples and what happens to that turn."""
    content = draw(CONTENT)
    finish = draw(st.sampled_from(["stop", "tool_calls", "length"]))
    return {
        "content": content if finish != "tool_calls" else content or [10],
        "finish": finish,
        "reasoning": draw(st.lists(st.integers(10, 97), max_size=3)),
        "rerendered": draw(st.booleans()),  # the template re-renders a token of the turn differently
        "logprobs": draw(st.booleans() | st.just(True)),
        "retried": draw(st.integers(0, 3)) == 0,
        "keep_empty": draw(st.booleans()),  # a harness may keep an empty truncated turn, or drop it
        "rewrite": draw(st.integers(0, 5)) == 0,  # then the harness edits an earlier message
        "reply": draw(st.lists(st.integers(10, 97), min_size=1, max_size=4)),
    }


def play(chat: Conversation, step: dict) -> list[dict]:
    """The rows one step produces: a retry (same prompt) first when drawn, then the kept attempt."""
    rows = []
    if step["retried"]:
        rows.append(chat.ask([RETRY] * (len(step["content"]) + 1), keep=False))
    content = step["content"]
    canonical = [RERENDERED, *content[1:]] if step["rerendered"] and content else None
    empty = step["finish"] == "length" and not content and not step["keep_empty"]
    rows.append(chat.ask(content, step["finish"], keep=not empty, reasoning=step["reasoning"],
                         canonical=canonical, logprobs=step["logprobs"]))
    chat.say("tool" if step["finish"] == "tool_calls" else "user", step["reply"])
    return rows
