"""The tiny model's forward pass in plain torch, over the weights transformers saved.

Importing transformers' Qwen3 modelling takes ~4 s, more than half of a gateway's start over the embedded
engine; the arithmetic itself is a few lines: per layer RMSNorm, attention (q and k normalized per head,
rotary positions, grouped-query heads through torch's SDPA), RMSNorm and a SiLU-gated MLP, with the
embedding tied to the output projection. tests/engine/test_qwen3.py checks it against transformers'
own forward on the same weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional

WEIGHTS_FILE = "model.safetensors"
KeysValues = tuple[torch.Tensor, torch.Tensor]  # one layer's, each [1, kv heads, positions, head dim]
Cache = list[KeysValues]  # per layer


@dataclass(frozen=True)
class Shape:
    """What the forward pass needs from a saved Qwen3 config.json."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    rope_theta: float

    @classmethod
    def read(cls, config: dict) -> Shape:
        """The shape of a config this module computes exactly, or a ValueError saying what differs."""
        rope = config.get("rope_parameters") or {"rope_type": "default", "rope_theta": config.get("rope_theta")}
        unsupported = {"model_type": config.get("model_type") != "qwen3",
                       "rope_type": rope.get("rope_type") != "default",
                       "tie_word_embeddings": not config.get("tie_word_embeddings"),
                       "attention_bias": bool(config.get("attention_bias")),
                       "hidden_act": config.get("hidden_act") != "silu",
                       "sliding_window": bool(config.get("use_sliding_window"))}
        if any(unsupported.values()):
            raise ValueError(f"not a plain tied Qwen3 config: {[name for name, bad in unsupported.items() if bad]}")
        return cls(config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"],
                   config["head_dim"], config["rms_norm_eps"], float(rope["rope_theta"]))


class Qwen3:
    """Hidden states and logits of a saved tied Qwen3 model (float32, one sequence at a time)."""

    def __init__(self, folder: Path) -> None:
        from safetensors.torch import load_file

        self.shape = Shape.read(json.loads((folder / "config.json").read_text()))
        self.weights = load_file(str(folder / WEIGHTS_FILE))
        self.embedding = self.weights["model.embed_tokens.weight"]
        half = torch.arange(0, self.shape.head_dim, 2, dtype=torch.float) / self.shape.head_dim
        self.inv_freq = 1.0 / (self.shape.rope_theta ** half)

    @property
    def vocab_size(self) -> int:
        return self.embedding.shape[0]

    def hidden(self, ids: list[int], cache: Cache | None = None) -> tuple[torch.Tensor, Cache]:
        """The final (normed) hidden state of each of `ids`, [len(ids), hidden], continuing the positions
        `cache` holds; and the cache extended by `ids`."""
        start = cache[0][0].shape[2] if cache else 0
        states = self.embedding[torch.tensor(ids)].unsqueeze(0)
        rotary = self._rotary(start, len(ids))
        extended = []
        for layer in range(self.shape.layers):
            prefix = f"model.layers.{layer}."
            attended, keys_values = self._attention(prefix, self._norm(states, prefix + "input_layernorm"), rotary,
                                                    cache[layer] if cache else None)
            states = states + attended
            states = states + self._mlp(prefix, self._norm(states, prefix + "post_attention_layernorm"))
            extended.append(keys_values)
        return self._norm(states, "model.norm")[0], extended

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Scores over the vocabulary (the output projection is the embedding)."""
        return functional.linear(hidden, self.embedding)

    def _norm(self, states: torch.Tensor, name: str) -> torch.Tensor:
        """RMSNorm, in the order transformers computes it (so rounding agrees too)."""
        variance = states.pow(2).mean(-1, keepdim=True)
        return self.weights[name + ".weight"] * (states * torch.rsqrt(variance + self.shape.eps))

    def _rotary(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of each position's angles, [1, 1, count, head dim] (broadcast over heads)."""
        positions = torch.arange(start, start + count, dtype=torch.float)
        angles = positions[:, None] * self.inv_freq
        both = torch.cat((angles, angles), dim=-1)[None, None]
        return both.cos(), both.sin()

    def _attention(self, prefix: str, states: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                   past: KeysValues | None) -> tuple[torch.Tensor, KeysValues]:
        length, attn = states.shape[1], prefix + "self_attn."
        queries = self._heads(states, attn + "q", normed=True)
        keys = self._heads(states, attn + "k", normed=True)
        values = self._heads(states, attn + "v", normed=False)
        queries, keys = _rotate(queries, *rotary), _rotate(keys, *rotary)
        if past is not None:
            keys, values = torch.cat((past[0], keys), dim=2), torch.cat((past[1], values), dim=2)
        mixed = functional.scaled_dot_product_attention(
            queries, keys, values, is_causal=length > 1, scale=self.shape.head_dim ** -0.5,
            enable_gqa=self.shape.heads != self.shape.kv_heads)
        mixed = mixed.transpose(1, 2).reshape(1, length, -1)
        return functional.linear(mixed, self.weights[attn + "o_proj.weight"]), (keys, values)

    def _heads(self, states: torch.Tensor, name: str, normed: bool) -> torch.Tensor:
        """A projection split into heads, [1, heads, positions, head dim]; q and k normalized per head."""
        projected = functional.linear(states, self.weights[name + "_proj.weight"])
        split = projected.view(1, states.shape[1], -1, self.shape.head_dim)
        return (self._norm(split, name + "_norm") if normed else split).transpose(1, 2)

    def _mlp(self, prefix: str, states: torch.Tensor) -> torch.Tensor:
        def project(name: str, values: torch.Tensor) -> torch.Tensor:
            return functional.linear(values, self.weights[f"{prefix}mlp.{name}_proj.weight"])

        return project("down", functional.silu(project("gate", states)) * project("up", states))


def _rotate(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions: each head's halves turned by the position's angles."""
    half = states.shape[-1] // 2
    turned = torch.cat((-states[..., half:], states[..., :half]), dim=-1)
    return states * cos + turned * sin
