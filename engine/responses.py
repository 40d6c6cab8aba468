"""Response bodies in vLLM 0.32's shapes: chat completions (JSON and SSE chunks), models, tokenize.

Every key vLLM sends is present (null where it does not apply), so a client written against vLLM reads
the embedded engine through the same code path.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from tracetap.engine.completion import Completion
from tracetap.engine.model import Step
from tracetap.engine.request import ChatRequest, CompletionRequest
from tracetap.engine.tokenizer import ChatTokenizer

SYSTEM_FINGERPRINT = "tracetap-engine-0.1.0"
LOWEST_LOGPROB = -9999.0  # vLLM's stand-in for -inf, which JSON cannot carry


def completion_id() -> str:
    return f"chatcmpl-{secrets.token_hex(8)}"


def chat_completion(
    done: Completion, request: ChatRequest, tokenizer: ChatTokenizer, model: str,
) -> dict[str, Any]:
    """The non-streaming `/v1/chat/completions` body."""
    choice = {
        "index": 0,
        "message": _message(done.message),
        "logprobs": _logprobs(done.steps, tokenizer) if request.logprobs else None,
        "finish_reason": done.finish_reason,
        "stop_reason": done.stop_reason,
        "token_ids": [step.token_id for step in done.steps] if request.return_token_ids else None,
        "routed_experts": None,
    }
    return _body(_head(completion_id(), "chat.completion", model), choice, done, prompt_logprobs=None,
                 prompt_token_ids=done.prompt_ids if request.return_token_ids else None, prompt_text=None)


def text_completion(
    done: Completion, request: CompletionRequest, tokenizer: ChatTokenizer, model: str,
) -> dict[str, Any]:
    """The non-streaming `/v1/completions` body: token data on the choice, legacy-shaped logprobs."""
    ids = [step.token_id for step in done.steps] if request.return_token_ids else None
    choice = {
        "index": 0,
        "text": done.text,
        "logprobs": _legacy_logprobs(done.steps, request, tokenizer) if request.logprobs else None,
        "finish_reason": done.finish_reason,
        "stop_reason": done.stop_reason,
        "token_ids": ids,
        "prompt_logprobs": None,
        "prompt_token_ids": done.prompt_ids if request.return_token_ids else None,
        "routed_experts": None,
    }
    return _body(_head(f"cmpl-{secrets.token_hex(8)}", "text_completion", model), choice, done)


def _body(head: dict[str, Any], choice: dict[str, Any], done: Completion, **fields: Any) -> dict[str, Any]:
    """A non-streaming body in vLLM's key order: head, the choice, usage, `fields`, then the unused extras."""
    return {
        **head,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": {**_usage(done), "prompt_tokens_details": None, "completion_tokens_details": None},
        **fields,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def text_chunks(
    done: Completion, request: CompletionRequest, tokenizer: ChatTokenizer, model: str,
) -> list[dict]:
    """The same completion as vLLM's `/v1/completions` SSE chunks: one per token, then the usage.

    The first chunk's choice carries `prompt_token_ids`; a chunk's `text_offset` is the length of the text
    sent before it (vLLM's streamed offsets count text, not token names).
    """
    head = _head(f"cmpl-{secrets.token_hex(8)}", "text_completion", model)
    pieces = _pieces(done.text, [step.token_id for step in done.steps], tokenizer)
    logprobs = _legacy_logprobs(done.steps, request, tokenizer) if request.logprobs else None
    chunks, sent = [], 0
    for index, (step, piece) in enumerate(zip(done.steps, pieces, strict=True)):
        last = index == len(done.steps) - 1
        choice = {
            "index": 0, "text": piece,
            "logprobs": _legacy_step(logprobs, index, sent) if logprobs else None,
            "finish_reason": done.finish_reason if last else None,
            "stop_reason": done.stop_reason if last else None,
        }
        if request.return_token_ids:
            choice.update(prompt_token_ids=None if index else done.prompt_ids, token_ids=[step.token_id])
        usage = {"usage": _usage(done, index + 1)} if request.continuous_usage else {}
        chunks.append({**head, "choices": [choice], **usage})
        sent += len(piece)
    if request.include_usage:
        chunks.append({**head, "choices": [], "usage": _usage(done), "system_fingerprint": SYSTEM_FINGERPRINT})
    return chunks


def chat_chunks(done: Completion, request: ChatRequest, tokenizer: ChatTokenizer, model: str) -> list[dict]:
    """The same completion as vLLM's SSE chunks: role (with prompt ids), one chunk per token, usage.

    Text arrives token by token; parsed tool calls and reasoning arrive whole in the finishing chunk.
    """
    head = _head(completion_id(), "chat.completion.chunk", model)
    role = {**head, "choices": [_delta({"role": "assistant", "content": ""}, None)]}
    if request.return_token_ids:
        role.update(prompt_token_ids=done.prompt_ids, prompt_text=None)
    chunks = [role]
    structured = done.message["tool_calls"] or done.message["reasoning"]
    ids = [step.token_id for step in done.steps]
    pieces = [""] * len(ids) if structured else _pieces(done.message["content"] or "", ids, tokenizer)
    for index, (step, piece) in enumerate(zip(done.steps, pieces, strict=True)):
        last = index == len(done.steps) - 1
        delta = _final_delta(done.message, piece) if last else ({"content": piece} if piece else {})
        choice = _delta(delta, _logprobs([step], tokenizer) if request.logprobs else None)
        if last:
            choice.update(finish_reason=done.finish_reason, stop_reason=done.stop_reason)
        if request.return_token_ids:
            choice["token_ids"] = [step.token_id]
        chunks.append({**head, "choices": [choice]})
    if request.include_usage:
        usage = {"usage": _usage(done), "system_fingerprint": SYSTEM_FINGERPRINT}
        chunks.append({**head, "choices": [], **usage})
    return chunks


def sse(chunks: list[dict]) -> list[bytes]:
    """Chunks as `data:` events followed by `data: [DONE]`, one frame each (sent one by one)."""
    events = [f"data: {json.dumps(chunk, ensure_ascii=False, separators=(',', ':'))}\n\n" for chunk in chunks]
    return [event.encode() for event in events] + [b"data: [DONE]\n\n"]


def models(served_model: str, max_model_len: int, root: str) -> dict[str, Any]:
    """`GET /v1/models` with vLLM's extra keys (root, parent, max_model_len, permission)."""
    created = int(time.time())
    permission = {
        "id": f"modelperm-{secrets.token_hex(8)}", "object": "model_permission", "created": created,
        "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
        "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
        "organization": "*", "group": None, "is_blocking": False,
    }
    card = {
        "id": served_model, "object": "model", "created": created, "owned_by": "tracetap", "root": root,
        "parent": None, "max_model_len": max_model_len, "permission": [permission],
    }
    return {"object": "list", "data": [card]}


def tokenized(ids: list[int], max_model_len: int, token_strs: list | None) -> dict[str, Any]:
    """`POST /tokenize`."""
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": token_strs}


def _head(response_id: str, kind: str, model: str) -> dict[str, Any]:
    return {"id": response_id, "object": kind, "created": int(time.time()), "model": model}


def _usage(done: Completion, sampled: int | None = None) -> dict[str, int]:
    """Token counts; `sampled` counts the tokens sent so far (continuous usage in a stream)."""
    prompt, completion = len(done.prompt_ids), len(done.steps) if sampled is None else sampled
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


def _message(parsed: dict[str, Any]) -> dict[str, Any]:
    """vLLM's message keys; `tool_calls` only when there are some (its serializer drops an empty list)."""
    message = {
        "role": "assistant", "content": parsed["content"], "refusal": None, "annotations": None,
        "audio": None, "function_call": None,
    }
    if parsed["tool_calls"]:
        message["tool_calls"] = parsed["tool_calls"]
    message["reasoning"] = parsed["reasoning"]
    return message


def _logprobs(steps: list[Step], tokenizer: ChatTokenizer) -> dict[str, Any]:
    """`{content: [{token, logprob, bytes, top_logprobs}]}`, one entry per token id, in order."""
    return {
        "content": [
            {**_entry(step.token_id, step.logprob, tokenizer), "top_logprobs": [
                _entry(token_id, logprob, tokenizer) for token_id, logprob in step.top
            ]}
            for step in steps
        ]
    }


def _legacy_logprobs(steps: list[Step], request: CompletionRequest, tokenizer: ChatTokenizer) -> dict[str, list]:
    """`{text_offset, token_logprobs, tokens, top_logprobs}`; each top dict is the sampled token, then the k best.

    Offsets count the token names, as vLLM's do (so `token_id:N` names count their own length)."""
    def name(token_id: int) -> str:
        return f"token_id:{token_id}" if request.tokens_as_ids else tokenizer.decode([token_id])

    tokens = [name(step.token_id) for step in steps]
    offsets = [sum(len(token) for token in tokens[:i]) for i in range(len(tokens))]
    return {
        "text_offset": offsets,
        "token_logprobs": [max(step.logprob, LOWEST_LOGPROB) for step in steps],
        "tokens": tokens,
        "top_logprobs": [_legacy_top(step, request.top_logprobs, name) for step in steps],
    }


def _legacy_step(logprobs: dict[str, list], index: int, offset: int) -> dict[str, list]:
    """One token's share of the legacy logprobs, its offset the length of the text already streamed."""
    return {**{key: [values[index]] for key, values in logprobs.items()}, "text_offset": [offset]}


def _legacy_top(step: Step, k: int, name: Callable[[int], str]) -> dict[str, float]:
    """The step lists the sampled token and k others, so its k best by logprob are the true top k."""
    best = sorted(step.top, key=lambda pair: -pair[1])[:k]
    pairs = [(step.token_id, step.logprob), *best]
    return {name(token_id): max(logprob, LOWEST_LOGPROB) for token_id, logprob in pairs}


def _entry(token_id: int, logprob: float, tokenizer: ChatTokenizer) -> dict[str, Any]:
    """`token` is the token's own decoded text; `bytes` its exact bytes (even a partial UTF-8 sequence)."""
    return {
        "token": tokenizer.decode([token_id]),
        "logprob": max(logprob, LOWEST_LOGPROB),
        "bytes": list(tokenizer.token_bytes(token_id)),
    }


def _delta(delta: dict[str, Any], logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": None}


def _final_delta(message: dict[str, Any], piece: str) -> dict[str, Any]:
    """The finishing chunk's delta: the rest of plain text, or the whole parsed message when structured."""
    if not message["tool_calls"] and not message["reasoning"]:
        return {"content": piece} if piece else {}
    delta: dict[str, Any] = {"content": message["content"]}
    if message["reasoning"]:
        delta["reasoning"] = message["reasoning"]
    if message["tool_calls"]:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    return delta


def _pieces(content: str, ids: list[int], tokenizer: ChatTokenizer) -> list[str]:
    """Each token's share of the text (partial characters held back); the pieces join to `content`."""
    sent, pieces = 0, []
    for end in range(1, len(ids)):
        text = tokenizer.decode(ids[:end], skip_special_tokens=True)
        upto = sent if text.endswith("\ufffd") else min(len(text), len(content))
        pieces.append(content[sent:upto])
        sent = max(sent, upto)
    return [*pieces, content[sent:]]
