"""One chat completion: render the prompt, then sample from the tiny model or play the script, then stop.

The result keeps what vLLM reports: prompt ids with the generation prompt, every sampled id (including the
end-of-turn token), raw logprobs aligned with those ids, and why generation ended.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracetap.engine.cache import home_dir
from tracetap.engine.model import Sampling, Step, TinyModel, load_model
from tracetap.engine.pieces import split_ids
from tracetap.engine.request import ChatRequest, CompletionRequest, EngineError, Generation
from tracetap.engine.script import Script
from tracetap.engine.tokenizer import END_OF_TEXT_ID, IM_END_ID, ChatTokenizer, load_tokenizer
from tracetap.tokens.message import ToolUse, chat_message, visible_text
from tracetap.tokens.parsing import find_stop

MAX_MODEL_LEN = 4096
END_OF_TURN = frozenset({IM_END_ID, END_OF_TEXT_ID})
TOOLS_MARK = "<tools>"  # opens the tool block the chat template writes into the system turn


@dataclass
class Completion:
    """What one call produced: the visible `text`; for chat also `message` (content, reasoning, tool calls)."""

    prompt_ids: list[int]
    steps: list[Step]
    text: str
    finish_reason: str
    stop_reason: str | int | None = None
    message: dict[str, Any] = field(default_factory=dict)


class Engine:
    """The tokenizer, the model and the optional script, loaded on first use."""

    def __init__(
        self, script: Script | None = None, seed: int = 0, max_model_len: int = MAX_MODEL_LEN,
        cache_dir: Path | None = None,
    ) -> None:
        self.script, self.max_model_len = script, max_model_len
        self.home = cache_dir or home_dir()  # holds tokenizer/ and model/
        self._seeds = random.Random(seed)  # seeds for requests that bring none: repeatable across restarts
        self._seed_lock = threading.Lock()

    @property
    def tokenizer(self) -> ChatTokenizer:
        return load_tokenizer(self.home / "tokenizer")

    @property
    def model(self) -> TinyModel:
        return load_model(self.tokenizer.size, self.home / "model")

    def prompt_ids(
        self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
        add_generation_prompt: bool = True, template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """The prompt's token ids, exactly as a completion for these messages would see them."""
        try:
            text = self.tokenizer.render(messages, tools, add_generation_prompt, **(template_kwargs or {}))
        except Exception as exc:  # jinja errors on malformed messages: the caller's mistake
            raise EngineError(f"Could not render the chat template: {exc}", param="messages") from None
        return self.tokenizer.encode(text)

    def complete(self, request: ChatRequest, session: str | None = None) -> Completion:
        """Run one chat completion (the model lock serializes the forward passes)."""
        prompt = self._fits(self.prompt_ids(request.messages, request.tools, True, request.template_kwargs))
        if self.script is None:
            done = self._sampled(request, prompt)
        else:
            reply = self._reply(session, request.parse_tools)
            done = self._scripted(request, prompt, self._turn_ids(request.messages, reply, request.tools))
        return _as_chat(request, done, self.tokenizer)

    def complete_prompt(self, request: CompletionRequest, session: str | None = None) -> Completion:
        """Run one `/v1/completions` call: the prompt is used as given, token ids verbatim."""
        prompt = self._fits(self._prompt_tokens(request.prompt))
        if self.script is None:
            return self._sampled(request, prompt)
        has_tools = TOOLS_MARK in self.tokenizer.decode(prompt)  # the template's tool block is in the prompt
        turn = self._turn_ids([{"role": "user", "content": ""}], self._reply(session, has_tools))
        return self._scripted(request, prompt, turn)

    def _prompt_tokens(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        unknown = [i for i in prompt if not 0 <= i < self.tokenizer.size]
        if unknown:
            raise EngineError(f"Token id {unknown[0]} is out of vocabulary", param="prompt")
        return prompt

    def _fits(self, prompt: list[int]) -> list[int]:
        """The prompt, if it leaves room for at least one generated token."""
        if len(prompt) >= self.max_model_len:
            raise EngineError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt "
                f"contains at least {len(prompt)} input tokens, which exceeds this limit even without any "
                "output tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={len(prompt)})",
                param="input_tokens",
            )
        return prompt

    def _budget(self, request: Generation, prompt: list[int]) -> int:
        return min(request.max_tokens or self.max_model_len, self.max_model_len - len(prompt))

    def _sampled(self, request: Generation, prompt: list[int]) -> Completion:
        stops = END_OF_TURN | set(request.stop_token_ids)
        watch = _StopWatch(self.tokenizer, request.stop)
        steps = self.model.generate(
            prompt, self._budget(request, prompt), self._sampling(request), request.candidates,
            lambda done: done[-1].token_id in stops or watch.hit(done[-1].token_id),
        )
        ids = [step.token_id for step in steps]
        if ids[-1] in stops:
            return self._done(prompt, steps, "stop", None if ids[-1] in END_OF_TURN else ids[-1])
        hit = find_stop(self._text(ids), request.stop)
        return self._done(prompt, steps, "stop", hit[1]) if hit else self._done(prompt, steps, "length")

    def _reply(self, session: str | None, has_tools: bool) -> dict[str, Any]:
        assert self.script is not None  # only scripted engines come here
        reply = self.script.next_reply(session, has_tools=has_tools)
        if reply is None:
            raise EngineError(f"No script line matches this request (has_tools={has_tools}).")
        return reply

    def _turn_ids(
        self, messages: list[dict[str, Any]], reply: dict[str, Any], tools: list[dict] | None = None,
    ) -> list[int]:
        """The scripted reply tokenized as the template renders it after `messages` (in pieces when the
        line says `"tokens": "split"`)."""
        message = {key: value for key, value in reply.items() if key != "tokens"}
        ids = self.tokenizer.encode(self.tokenizer.assistant_turn(messages, message, tools))
        return split_ids(ids, self.tokenizer) if reply.get("tokens") == "split" else ids

    def _scripted(self, request: Generation, prompt: list[int], forced: list[int]) -> Completion:
        """The forced reply scored by the model, cut at the token budget."""
        budget = self._budget(request, prompt)
        steps = self.model.score(prompt, forced[:budget], request.candidates)
        return self._done(prompt, steps, "length" if len(forced) > budget else "stop")

    def _done(
        self, prompt: list[int], steps: list[Step], finish: str, stop_reason: str | int | None = None,
    ) -> Completion:
        text = visible_text([step.token_id for step in steps], stop_reason, self.tokenizer)
        return Completion(prompt, steps, text, finish, stop_reason)

    def _text(self, ids: list[int]) -> str:
        """Visible text: control tokens dropped, tool and think markers kept (vLLM's skip_special_tokens)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _sampling(self, request: Generation) -> Sampling:
        if request.seed is None:
            with self._seed_lock:
                seed = self._seeds.getrandbits(63)
        else:
            seed = request.seed
        return Sampling(request.temperature, request.top_p, seed)


def _as_chat(request: ChatRequest, done: Completion, tokenizer: ChatTokenizer) -> Completion:
    """The chat view of the sampled ids: the message and, for a parsed auto call, a `tool_calls` finish."""
    ids = [step.token_id for step in done.steps]
    tools = ToolUse.of(request.tools, request.tool_choice)
    done.message, done.finish_reason = chat_message(ids, done.finish_reason, done.stop_reason, tokenizer, tools)
    return done


class _StopWatch:
    """Notices a stop string as soon as the token completing it is sampled (compares bytes, no decoding)."""

    def __init__(self, tokenizer: ChatTokenizer, stops: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = [stop.encode() for stop in stops]
        self.longest = max((len(stop) for stop in self.stops), default=0)
        self.tail = b""

    def hit(self, token_id: int) -> bool:
        if not self.stops:
            return False
        new = self.tokenizer.visible_bytes(token_id)
        window = self.tail + new
        self.tail = window[-self.longest:]
        return any(stop in window for stop in self.stops)
