"""The request fields the upstream's Chat Completions API defines: the only ones forwarded to it.

A harness's unknown top-level fields (an `api_key`, SDK `extra_headers`, provider-only settings)
never leave the gateway: OpenAI's own request fields that engines serve, plus the sampling and
template parameters vLLM (0.32) and SGLang add. Fields the gateway sets itself (`stream`,
`logprobs`, the token flags) are listed so a harness's own value reaches `with_token_flags`.
"""

from __future__ import annotations

OPENAI_FIELDS = frozenset({
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
    "max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty", "frequency_penalty",
    "logit_bias", "logprobs", "top_logprobs", "response_format", "stream", "stream_options",
    "reasoning_effort",
})
VLLM_FIELDS = frozenset({
    "top_k", "min_p", "repetition_penalty", "length_penalty", "use_beam_search", "best_of",
    "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
    "spaces_between_special_tokens", "truncate_prompt_tokens", "prompt_logprobs", "allowed_token_ids",
    "bad_words", "echo", "add_generation_prompt", "continue_final_message", "add_special_tokens",
    "documents", "chat_template", "chat_template_kwargs", "mm_processor_kwargs", "structured_outputs",
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
    "guided_whitespace_pattern", "structural_tag", "priority", "return_tokens_as_token_ids",
    "return_token_ids", "include_reasoning", "thinking_token_budget", "vllm_xargs",
})
SGLANG_FIELDS = frozenset({"regex", "ebnf", "json_schema", "no_stop_trim", "separate_reasoning",
                           "stream_reasoning", "return_prompt_token_ids", "return_meta_info"})
FORWARDED = OPENAI_FIELDS | VLLM_FIELDS | SGLANG_FIELDS


def forwarded(body: dict) -> dict:
    """The fields of a Chat Completions body the upstream API defines (a new dict; values shared)."""
    return {key: value for key, value in body.items() if key in FORWARDED}
