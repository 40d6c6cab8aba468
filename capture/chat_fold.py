"""vLLM chat stream chunks folded into the body a non-streaming call would have returned.

One fold serves a whole SSE body (`fold_chat_stream`) and a live stream chunk by chunk (`ChatFold.add`).
Prompt ids come on the first chunk only; every later chunk may carry `token_ids` and logprobs, even when
its delta is empty. With continuous usage stats every chunk carries the usage so far: the last one wins.
"""

from __future__ import annotations

import copy
import json

from tracetap.capture import sse

_TOP_KEYS = ("id", "created", "model", "system_fingerprint", "usage")


class ChatFold:
    """The answer so far; `body()` is well formed at any point (a partial answer when the stream stopped early)."""

    def __init__(self) -> None:
        self.top: dict = {}
        self.choice: dict = {"index": 0, "message": {"role": "assistant", "content": None}, "logprobs": None,
                             "finish_reason": None, "stop_reason": None, "token_ids": None}
        self.calls: dict[int, dict] = {}

    def add(self, chunk: dict) -> None:
        for key in _TOP_KEYS:
            if chunk.get(key) is not None:
                self.top[key] = chunk[key]
        if chunk.get("prompt_token_ids") is not None and "prompt_token_ids" not in self.top:
            self.top["prompt_token_ids"] = chunk["prompt_token_ids"]
        for part in chunk.get("choices") or []:
            if part.get("index", 0) == 0:
                self._add_choice(part)

    def body(self) -> dict:
        message = dict(self.choice["message"])
        if self.calls:
            message["tool_calls"] = [copy.deepcopy(self.calls[i]) for i in sorted(self.calls)]
        choice = {**self.choice, "message": message}
        return {"object": "chat.completion", "choices": [choice], **copy.deepcopy(self.top)}

    def _add_choice(self, part: dict) -> None:
        _fold_delta(self.choice["message"], self.calls, part.get("delta") or {})
        if part.get("token_ids") is not None:
            self.choice["token_ids"] = (self.choice["token_ids"] or []) + list(part["token_ids"])
        if (part.get("logprobs") or {}).get("content") is not None:
            self.choice["logprobs"] = self.choice["logprobs"] or {"content": []}
            self.choice["logprobs"]["content"] += part["logprobs"]["content"]
        for key in ("finish_reason", "stop_reason"):
            if part.get(key) is not None:
                self.choice[key] = part[key]


def fold_chat_stream(sse_text: str) -> dict:
    """A whole vLLM chat SSE body as the non-streaming answer."""
    fold = ChatFold()
    for data in sse.payloads(sse_text):
        if data != sse.DONE:
            fold.add(json.loads(data))
    return fold.body()


def _fold_delta(message: dict, calls: dict[int, dict], delta: dict) -> None:
    for key in ("content", "reasoning", "reasoning_content"):
        if isinstance(delta.get(key), str):
            message[key] = (message.get(key) or "") + delta[key]
    for call in delta.get("tool_calls") or []:
        slot = calls.setdefault(call.get("index", 0), {"id": None, "type": "function",
                                                       "function": {"name": None, "arguments": ""}})
        slot["id"] = call.get("id") or slot["id"]
        function = call.get("function") or {}
        slot["function"]["name"] = function.get("name") or slot["function"]["name"]
        slot["function"]["arguments"] += function.get("arguments") or ""
