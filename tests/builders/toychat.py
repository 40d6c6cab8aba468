"""A toy chat template over small ints, shaped like ChatML, for hand-made completions.

`<start> role \\n content <end> \\n` per message, `<start> assistant \\n` as the generation prompt
(followed by an empty think block `<think> \\n </think> \\n` when thinking is off). Content ids are
>= 10, so they never collide with the structure tokens. `decode` gives each id a text; the ids in
MERGED stand for the text of two others (a re-rendered token boundary).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

START, EOT, NL, THINK, UNTHINK = 1, 2, 3, 8, 9
ROLES = {"system": 4, "user": 5, "assistant": 6, "tool": 7}
GENERATION_PROMPT = [START, ROLES["assistant"], NL]
THINKING_OFF = [*GENERATION_PROMPT, THINK, NL, UNTHINK, NL]
NATURAL = ("stop", "tool_calls")
MERGED = {90: (30, 31), 91: (32, 33)}


def render(messages: list[tuple[str, list[int]]], generation_prompt: bool = True,
           thinking: bool = True) -> list[int]:
    ids = []
    for role, content in messages:
        ids += [START, ROLES[role], NL, *content, EOT, NL]
    return ids + ((GENERATION_PROMPT if thinking else THINKING_OFF) if generation_prompt else [])


def decode(ids) -> str:
    """The toy tokenizer's text for ids: `<n>` per content id, a merged id as its two parts."""
    return "".join(f"<{part}>" for token in ids for part in MERGED.get(int(token), (int(token),)))


def completion(prompt: list[int], sampled: list[int], finish: str = "stop", *, logprobs: bool = True,
               text: str = "text", session_id: str = "s1", **extra) -> dict:
    """A completions row with the columns the builders read (the writer fills seq and ids)."""
    return {
        "session_id": session_id, "status": "ok", "http_status": 200, "served_model": "toy",
        "prompt_token_ids": list(prompt), "completion_token_ids": list(sampled),
        "logprobs": [-0.5 - i / 64 for i in range(len(sampled))] if logprobs else None,
        "finish_reason": finish, "prompt_tokens": len(prompt), "completion_tokens": len(sampled),
        "chat_response_json": json.dumps({"choices": [{"message": {"content": text}}]}),
        **extra,
    }


def failure(http_status: int, status: str = "upstream_error", session_id: str = "s1") -> dict:
    return {"session_id": session_id, "status": status, "http_status": http_status, "error": "failed"}


@dataclass
class Conversation:
    """One agent's history. `ask` returns the row vLLM would give for the current history.

    `messages` is what the harness re-sends (assistant turns as the template re-renders them);
    `spoken` is the same history with each assistant turn as the model sampled it.
    """

    system: list[int]
    session_id: str = "s1"
    thinking: bool = True  # False: the template adds an empty think block after the generation prompt
    messages: list[tuple[str, list[int]]] = field(default_factory=list)
    spoken: list[tuple[str, list[int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.say("system", self.system)

    def say(self, role: str, content: list[int]) -> Conversation:
        self.messages.append((role, content))
        self.spoken.append((role, content))
        return self

    def ask(self, content: list[int], finish: str = "stop", *, keep: bool = True,
            canonical: list[int] | None = None, reasoning: list[int] = (), **extra) -> dict:
        """The call sampling `reasoning + content`; the turn joins the history unless `keep` is False."""
        sampled = [*reasoning, *content] + ([EOT] if finish in NATURAL else [])
        row = completion(render(self.messages, thinking=self.thinking), sampled, finish, text="text" if content else "",
                         session_id=self.session_id, **extra)
        if finish == "tool_calls":
            row["tool_calls"] = [{"id": "call-1", "name": "Bash", "arguments": "{}"}]
        if keep:
            self.messages.append(("assistant", content if canonical is None else canonical))
            self.spoken.append(("assistant", [*reasoning, *content]))
        return row

    def expected_stream(self, last: dict) -> list[int]:
        """Prompt + response a merged trace must hold: the history with every assistant turn as
        sampled, ending with the last call's sampled ids."""
        turn = max(i for i, (role, _) in enumerate(self.spoken) if role == "assistant")
        return render(self.spoken[:turn]) + list(last["completion_token_ids"])


def numbered(rows: list[dict]) -> list[dict]:
    """Rows with seq and completion_id filled in, as the store writer would."""
    return [{**row, "seq": i, "completion_id": f"cmpl-{i}"} for i, row in enumerate(rows)]
