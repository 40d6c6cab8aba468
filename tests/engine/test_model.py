"""The tiny model: sampling, raw logprobs, forced-token scoring, repeatable weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tracetap.engine.model import Sampling, TinyModel, build_model, load_model
from tracetap.engine.tokenizer import ChatTokenizer


@pytest.fixture(scope="module")
def model(tokenizer: ChatTokenizer) -> TinyModel:
    return load_model(tokenizer.size)


@pytest.fixture(scope="module")
def prompt(tokenizer: ChatTokenizer) -> list[int]:
    return tokenizer.encode(tokenizer.render([{"role": "user", "content": "Say something."}]))


def never(_steps) -> bool:
    return False


def test_scoring_reproduces_sampled_logprobs(model: TinyModel, prompt: list[int]) -> None:
    """One forward pass over forced tokens gives the logprobs step-by-step decoding reported."""
    steps = model.generate(prompt, 20, Sampling(1.0, 1.0, seed=4), 3, never)
    scored = model.score(prompt, [s.token_id for s in steps], 3)
    assert [s.token_id for s in scored] == [s.token_id for s in steps]
    for generated, forced in zip(steps, scored, strict=True):
        assert forced.logprob == pytest.approx(generated.logprob, abs=1e-4)
        assert [t for t, _ in forced.top] == [t for t, _ in generated.top]


def test_logprobs_are_a_distribution_over_real_tokens(model: TinyModel, tokenizer: ChatTokenizer) -> None:
    logprobs = model._log_softmax(torch.randn(model.model.vocab_size))
    assert logprobs.exp().sum().item() == pytest.approx(1.0, abs=1e-4)
    assert torch.isinf(logprobs[tokenizer.size:]).all()  # padding rows can never be sampled


def test_top_logprobs_put_the_sampled_token_first(model: TinyModel, prompt: list[int]) -> None:
    for step in model.generate(prompt, 10, Sampling(1.0, 1.0, seed=9), 4, never):
        assert len(step.top) == 4 and step.top[0] == (step.token_id, step.logprob)
        rest = [logprob for _, logprob in step.top[1:]]
        assert rest == sorted(rest, reverse=True)


def test_greedy_top_logprobs_are_the_plain_top_k(model: TinyModel, prompt: list[int]) -> None:
    (step,) = model.generate(prompt, 1, Sampling(0.0), 5, never)
    values = [logprob for _, logprob in step.top]
    assert values == sorted(values, reverse=True) and step.top[0][0] == step.token_id


def test_tiny_top_p_is_greedy(model: TinyModel, prompt: list[int]) -> None:
    greedy = model.generate(prompt, 6, Sampling(0.0), 0, never)
    nucleus = model.generate(prompt, 6, Sampling(1.5, 1e-6, seed=1), 0, never)
    assert [s.token_id for s in nucleus] == [s.token_id for s in greedy]


def test_generation_stops_when_told(model: TinyModel, prompt: list[int]) -> None:
    assert len(model.generate(prompt, 50, Sampling(1.0, seed=2), 0, lambda steps: len(steps) == 3)) == 3
    assert len(model.generate(prompt, 4, Sampling(1.0, seed=2), 0, never)) == 4


def test_weights_are_the_same_on_every_build(model: TinyModel, tmp_path: Path) -> None:
    build_model(tmp_path)
    rebuilt = load_model(model.vocab_limit, tmp_path)
    assert model.model.weights.keys() == rebuilt.model.weights.keys()
    for name, mine in model.model.weights.items():
        assert torch.equal(mine, rebuilt.model.weights[name]), name
