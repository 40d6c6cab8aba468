"""The plain-torch forward pass computes what transformers' Qwen3 computes on the same weights."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from tracetap.engine.model import load_model
from tracetap.engine.qwen3 import Qwen3, Shape
from tracetap.engine.tokenizer import ChatTokenizer
from transformers import Qwen3ForCausalLM


@pytest.fixture(scope="module")
def folder(tokenizer: ChatTokenizer, tracetap_home: Path) -> Path:
    load_model(tokenizer.size)  # builds the weights on first use
    return tracetap_home / "model"


@pytest.fixture(scope="module")
def models(folder: Path) -> tuple[Qwen3, Qwen3ForCausalLM]:
    return Qwen3(folder), Qwen3ForCausalLM.from_pretrained(str(folder)).eval()


@pytest.mark.parametrize("length", [1, 2, 300])
def test_a_prompt_s_hidden_states_and_logits_are_transformers(models, length: int) -> None:
    mine, theirs = models
    rng = random.Random(length)
    ids = [rng.randrange(mine.vocab_size) for _ in range(length)]
    with torch.inference_mode():
        hidden, _ = mine.hidden(ids)
        expected = theirs.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        assert torch.allclose(hidden, expected, rtol=0, atol=1e-6)
        assert torch.allclose(mine.logits(hidden), theirs.lm_head(expected), rtol=0, atol=1e-5)


def test_decoding_with_the_cache_is_transformers_decoding_with_its_cache(models) -> None:
    mine, theirs = models
    rng = random.Random(7)
    prompt = [rng.randrange(mine.vocab_size) for _ in range(50)]
    with torch.inference_mode():
        _, cache = mine.hidden(prompt)
        answer = theirs(input_ids=torch.tensor([prompt]), use_cache=True)
        for _ in range(6):
            token = rng.randrange(mine.vocab_size)
            hidden, cache = mine.hidden([token], cache)
            answer = theirs(input_ids=torch.tensor([[token]]), cache=answer.cache, use_cache=True)
            assert torch.allclose(mine.logits(hidden[-1]), answer.logits[0, -1], rtol=0, atol=1e-5)
        assert cache[0][0].shape[2] == len(prompt) + 6


def test_a_config_it_does_not_compute_is_refused(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    assert Shape.read(config).layers == config["num_hidden_layers"]
    for change in [{"tie_word_embeddings": False}, {"model_type": "llama"}, {"attention_bias": True},
                   {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}]:
        with pytest.raises(ValueError, match="not a plain tied Qwen3"):
            Shape.read({**config, **change})
