"""The tiny seeded random-weight Qwen3 model: real sampling and real logprobs on a CPU, nothing more.

It stands in for a served model in development, tests and the demo; its text is gibberish by design.
transformers makes the weights once (build_model); serving runs them through engine/qwen3.py, plain torch.
torch is imported lazily so `import engine` stays cheap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracetap.engine.cache import build_once, home_dir

if TYPE_CHECKING:
    from tracetap.engine.qwen3 import Qwen3

CONFIG: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
}
WEIGHTS_SEED = 0
GREEDY_BELOW = 1e-5  # temperatures under this decode greedily, as vLLM does
SCORE_CHUNK = 128  # forced positions projected onto the vocabulary at a time (bounds memory)


@dataclass(frozen=True)
class Sampling:
    """How to pick each token; `seed` makes a sampled run repeatable."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class Step:
    """One generated (or forced) token with its logprob and the `top_logprobs` candidates, best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def build_model(out_dir: Path) -> None:
    """Create the model from a fixed seed and save it, so every machine gets the same weights."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(WEIGHTS_SEED)
    Qwen3ForCausalLM(Qwen3Config(**CONFIG)).save_pretrained(str(out_dir))


def load_model(vocab_limit: int, cache_dir: Path | None = None) -> TinyModel:
    """The model, built on first use into `cache_dir` (default `$TRACETAP_HOME/model`)."""
    return _load(Path(cache_dir or home_dir() / "model").resolve(), vocab_limit)


@cache
def _load(folder: Path, vocab_limit: int) -> TinyModel:
    """One instance per cache folder per process."""
    from tracetap.engine.qwen3 import Qwen3

    return TinyModel(Qwen3(build_once(folder, build_model)), vocab_limit)


class TinyModel:
    """Generation and forced-token scoring; one forward pass at a time (calls hold a lock)."""

    def __init__(self, model: Qwen3, vocab_limit: int) -> None:
        self.model = model
        self.vocab_limit = vocab_limit  # ids from here on are embedding padding, never real tokens
        self._lock = threading.Lock()

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, sampling: Sampling, top_k: int,
        is_done: Callable[[list[Step]], bool],
    ) -> list[Step]:
        """Sample up to `max_new_tokens` tokens, stopping early when `is_done(steps)` says so."""
        import torch

        generator = torch.Generator().manual_seed(sampling.seed)
        steps: list[Step] = []
        with self._lock, torch.inference_mode():
            hidden, cache = self.model.hidden(prompt_ids)
            while True:
                logprobs = self._log_softmax(self.model.logits(hidden[-1]))
                token = self._pick(logprobs, sampling, generator)
                steps.append(Step(token, float(logprobs[token]), _top(logprobs, token, top_k)))
                if len(steps) >= max_new_tokens or is_done(steps):
                    return steps
                hidden, cache = self.model.hidden([token], cache)

    def score(self, prompt_ids: list[int], forced_ids: list[int], top_k: int) -> list[Step]:
        """Logprobs of `forced_ids` following `prompt_ids`, from one forward pass (scripted replies)."""
        import torch

        if not forced_ids:
            return []
        with self._lock, torch.inference_mode():
            hidden = self.model.hidden(prompt_ids + forced_ids[:-1])[0][-len(forced_ids):]
            steps = []
            for start in range(0, len(forced_ids), SCORE_CHUNK):
                tokens = forced_ids[start:start + SCORE_CHUNK]
                logprobs = self._log_softmax(self.model.logits(hidden[start:start + SCORE_CHUNK]))
                for row, token in zip(logprobs, tokens, strict=True):
                    steps.append(Step(token, float(row[token]), _top(row, token, top_k)))
            return steps

    def _log_softmax(self, logits: Any) -> Any:
        """Raw logprobs over the real tokens (before temperature/top_p, as vLLM reports them)."""
        logits = logits.float()
        logits[..., self.vocab_limit:] = float("-inf")
        return logits.log_softmax(dim=-1)

    @staticmethod
    def _pick(logprobs: Any, sampling: Sampling, generator: Any) -> int:
        """Greedy at temperature ~0, else temperature + nucleus sampling from the seeded generator."""
        import torch

        if sampling.temperature < GREEDY_BELOW:
            return int(logprobs.argmax())
        probs = (logprobs / sampling.temperature).softmax(dim=-1)
        if sampling.top_p < 1.0:
            probs = torch.from_numpy(_nucleus(probs.numpy(), sampling.top_p))
        return int(torch.multinomial(probs, 1, generator=generator))


def _nucleus(probs: Any, top_p: float) -> Any:
    """Zero every token outside the smallest best-first set reaching top_p (numpy sorts ~5x faster)."""
    import numpy as np

    order = np.argsort(-probs)
    ranked = probs[order]
    kept = probs.copy()
    kept[order[np.cumsum(ranked) - ranked >= top_p]] = 0.0
    return kept


def _top(logprobs: Any, chosen: int, k: int) -> list[tuple[int, float]]:
    """vLLM's chat `top_logprobs`: the chosen token first, then the best others, k in all."""
    if k <= 0:
        return []
    values, ids = logprobs.topk(k)
    others = [(int(i), float(v)) for v, i in zip(values, ids, strict=True) if int(i) != chosen]
    return [(chosen, float(logprobs[chosen])), *others][:k]
