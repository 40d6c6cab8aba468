"""`--tokenize gateway`: the gateway renders and tokenizes each prompt itself and parses the sampled ids.

The chat request the adapters built is rendered with the served model's chat template and tokenizer, sent
to the upstream's `/v1/completions` as token ids (asking for the sampled ids and logprobs; its structured
output and forced tool choice as capture/output_constraints.py writes them), and the answer is turned back
into a vLLM chat completion (tokens/message.py), so the adapters, the store and the provider shapes work
exactly as in `upstream` mode. The stored `chat_request` stays the chat request (what replay matches on);
`metadata_json` says `{"tokenization": "gateway"}`, which earlier completion the prompt continues and how
many tokens it added (capture/continuity.py). Streamed, the completions chunks become chat chunks as they
arrive (capture/tokenized_stream.py) that fold into the same answer.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Any

from tracetap.capture.answer_fields import InvalidAnswer
from tracetap.capture.continuity import Continuity, Prompt
from tracetap.capture.jsontext import dumps
from tracetap.capture.output_constraints import output_constraints
from tracetap.capture.tokenized_stream import ChatChunks, chat_id
from tracetap.capture.upstream import (
    STREAM_OPTIONS,
    LiveChatStream,
    UpstreamClient,
    UpstreamError,
    UpstreamResult,
    parse_chat_response,
)
from tracetap.engine.tokenizer import ChatTokenizer
from tracetap.tokens.message import ToolUse, chat_message
from tracetap.tokens.parsing import thinking_open
from tracetap.tokens.streaming import ReplyStream, Settings

# chat fields `/v1/completions` takes as they are (vLLM's sampling parameters; the structured-output ones are
# in capture/output_constraints.py)
SAMPLING = ("model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "n",
            "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "ignore_eos",
            "min_tokens", "include_stop_str_in_output")
METADATA = {"tokenization": "gateway"}


class TokenizingUpstream:
    """The `Upstream` of `--tokenize gateway`: prompts as token ids, answers parsed here."""

    def __init__(self, client: UpstreamClient, tokenizer: ChatTokenizer) -> None:
        self.client, self.tokenizer = client, tokenizer
        self.continuity = Continuity(tokenizer, tokenizer.end_of_turn)

    @property
    def models(self) -> list[str]:
        return self.client.models

    @models.setter
    def models(self, names: list[str]) -> None:
        self.client.models = names

    @property
    def served_model(self) -> str | None:
        return self.client.served_model

    @served_model.setter
    def served_model(self, name: str | None) -> None:
        self.client.served_model = name

    @property
    def streams_tokens(self) -> bool:
        """The upstream's completions stream carries token ids when its chat stream does (vLLM, the engine)."""
        return self.client.streams_tokens

    async def discover(self) -> list[str]:
        return await self.client.discover()

    async def resolve_model(self, requested: str | None) -> str | None:
        return await self.client.resolve_model(requested)

    async def tokenize(self, chat_request: dict) -> int:
        return await asyncio.to_thread(self._count, chat_request)

    def _count(self, chat_request: dict) -> int:
        return len(self.tokenizer.encode(self._render(chat_request)))

    async def aclose(self) -> None:
        await self.client.aclose()

    async def chat(self, chat_request: dict, session_id: str | None = None,
                   completion_id: str | None = None) -> UpstreamResult:
        """Render (continuing the session's earlier call when the request extends it), call `/v1/completions`
        with the ids, parse; errors as UpstreamError like the client's. The call is remembered under
        `completion_id`."""
        started = time.perf_counter()
        prompt, sent, metadata = await self._prepare(chat_request, session_id, stream=False)
        try:
            answer = await self.client.post_json("/v1/completions", sent, session_id)
            body = await asyncio.to_thread(self._as_chat, chat_request, answer, reading(chat_request, prompt.text))
            capture = parse_chat_response(body)
        except UpstreamError as exc:
            exc.request, exc.metadata = chat_request, metadata
            raise
        except (InvalidAnswer, KeyError, IndexError, TypeError, ValueError) as exc:
            raise UpstreamError("invalid", f"the upstream's completion is unusable: {exc}", 502) from None
        await self._remember(session_id, completion_id, prompt, capture.completion_token_ids or [])
        ms = (time.perf_counter() - started) * 1000
        return UpstreamResult(chat_request, body, capture, ms, metadata, request_json=dumps(chat_request),
                              engine=self.client.base_url)

    async def chat_stream(self, chat_request: dict, session_id: str | None = None,
                          completion_id: str | None = None) -> LiveChatStream:
        """`chat` as a stream of chat chunks (see `ChatStream`); the call is remembered only when the upstream
        finished it. Raises UpstreamError before the stream starts."""
        started = time.perf_counter()
        prompt, sent, metadata = await self._prepare(chat_request, session_id, stream=True)
        try:
            events = await self.client.open_sse("/v1/completions", sent, session_id)
        except UpstreamError as exc:
            exc.request, exc.metadata = chat_request, metadata
            raise
        parser = ReplyStream(self.tokenizer, reading(chat_request, prompt.text))
        done = partial(self._remember, session_id, completion_id, prompt)
        chunks = ChatChunks(events, parser, partial(self._logprobs, chat_request=chat_request), done, metadata)
        stream = LiveChatStream(chunks, chat_request, dumps(chat_request), started)
        stream.metadata = metadata
        return stream

    async def _prepare(self, chat_request: dict, session_id: str | None, stream: bool) -> tuple[Prompt, str, dict]:
        """The prompt (continuing the session when it can), the completions request text, the call's metadata."""
        prompt = await asyncio.to_thread(self._prompt, chat_request, session_id or "")
        sent = dumps(self._completions_request(chat_request, prompt.ids, stream))
        return prompt, sent, {**METADATA, **prompt.metadata()}

    async def _remember(self, session_id: str | None, completion_id: str | None, prompt: Prompt,
                        sampled: list[int]) -> None:
        """Keep an answered call for continuity (a call without an id or without sampled ids is not kept)."""
        if completion_id is not None and sampled:
            await asyncio.to_thread(self.continuity.remember, session_id or "", completion_id, prompt, sampled)

    def _prompt(self, chat_request: dict, session: str) -> Prompt:
        return self.continuity.prompt(session, self._render(chat_request), self._block(chat_request))

    def _render(self, chat_request: dict) -> str:
        """The prompt text; a history the template cannot render is the caller's 400."""
        try:
            text = self.tokenizer.render(chat_request.get("messages") or [], chat_request.get("tools"), True,
                                         **_template_kwargs(chat_request))
        except Exception as exc:  # jinja raises anything on a malformed history
            message = f"Could not render the chat template: {exc}"
            raise UpstreamError("http", message, 400, {"error": {"message": message}}) from None
        return text

    def _block(self, chat_request: dict) -> str:
        """What the generation prompt adds that past turns leave out (continuity.py); none for a template
        that cannot render the probe history."""
        try:
            return self.tokenizer.generation_block(**_template_kwargs(chat_request))
        except Exception:  # jinja raises anything
            return ""

    def _completions_request(self, chat_request: dict, prompt: list[int], stream: bool) -> dict[str, Any]:
        """The chat request's sampling fields and output constraints with the prompt as ids; token data asked
        for as in chat (streamed with the usage on every chunk)."""
        sent = {key: chat_request[key] for key in SAMPLING if chat_request.get(key) is not None}
        sent.update(output_constraints(chat_request))
        asked = chat_request.get("max_completion_tokens") or chat_request.get("max_tokens")
        room = (self.client.max_model_len or 0) - len(prompt)
        if asked or room > 0:  # chat's default is the rest of the context; completions' is only 16
            sent["max_tokens"] = asked or room
        top = chat_request.get("top_logprobs") if chat_request.get("logprobs") is True else 0
        sent.update(prompt=prompt, logprobs=top or 0, return_token_ids=True, return_tokens_as_token_ids=True,
                    stream=stream)
        return sent | ({"stream_options": dict(STREAM_OPTIONS)} if stream else {})

    def _as_chat(self, chat_request: dict, answer: dict, how: Settings) -> dict[str, Any]:
        """vLLM's chat completion body for the completions answer (the shape upstream mode gets)."""
        choice = answer["choices"][0]
        ids = choice["token_ids"]
        parsed, finish = chat_message(ids, choice["finish_reason"], choice.get("stop_reason"), self.tokenizer,
                                      how.tools, how.include_stop, how.opened)
        message = {"role": "assistant", "content": parsed["content"], "reasoning": parsed["reasoning"]}
        if parsed["tool_calls"]:
            message["tool_calls"] = parsed["tool_calls"]
        out_choice = {"index": 0, "message": message, "finish_reason": finish,
                      "stop_reason": choice.get("stop_reason"), "token_ids": ids,
                      "logprobs": self._logprobs(ids, choice.get("logprobs"), chat_request)}
        head = {key: answer.get(key) for key in ("created", "model", "system_fingerprint", "usage")}
        return {"id": chat_id(answer.get("id")), "object": "chat.completion",
                **head, "choices": [out_choice], "prompt_token_ids": choice.get("prompt_token_ids")}

    def _logprobs(self, ids: list[int], legacy: dict | None, chat_request: dict) -> dict | None:
        """Chat-shaped entries from the legacy form, the alternatives in the upstream's order (sampled
        one first); tokens named `token_id:N` keep their id, so text and bytes come from the tokenizer."""
        if not legacy:
            return None
        k = chat_request.get("top_logprobs") if chat_request.get("logprobs") is True else 0
        tops = legacy.get("top_logprobs") or [{} for _ in ids]
        return {"content": [
            {**self._entry(f"token_id:{token_id}", logprob),
             "top_logprobs": [self._entry(name, value) for name, value in list((top or {}).items())[: k or 0]]}
            for token_id, logprob, top in zip(ids, legacy["token_logprobs"], tops, strict=True)
        ]}

    def _entry(self, name: str, logprob: float) -> dict[str, Any]:
        """`{token, logprob, bytes}` (+ `token_id` when the name carries one; else the name is the text)."""
        digits = name.removeprefix("token_id:")
        if not (name.startswith("token_id:") and digits.isdigit()):
            return {"token": name, "logprob": logprob, "bytes": list(name.encode())}
        token_id = int(digits)
        text, raw = self.tokenizer.decode([token_id]), self.tokenizer.token_bytes(token_id)
        return {"token": text, "token_id": token_id, "logprob": logprob, "bytes": list(raw)}


def _template_kwargs(chat_request: dict) -> dict[str, Any]:
    """The chat template's own arguments (`enable_thinking`, ...)."""
    return chat_request.get("chat_template_kwargs") or {}


def reading(chat_request: dict, prompt: str) -> Settings:
    """How the sampled ids are read, streamed or whole: the request's tools and stops, and whether the
    rendered prompt left a `<think>` open."""
    stop = chat_request.get("stop")
    return Settings(ToolUse.of(chat_request.get("tools"), chat_request.get("tool_choice")), thinking_open(prompt),
                    [stop] if isinstance(stop, str) else list(stop or []), chat_request.get("stop_token_ids") or [],
                    bool(chat_request.get("include_stop_str_in_output")))
