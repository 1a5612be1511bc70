"""The minimal cached generate path against an uncached argmax loop, and its edge cases."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import vsurge
from vsurge.config import ModelConfig
from dense_generator import Generator, bucket_length, greedy_generate

TINY = ModelConfig(architecture="llama", vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=128)


@pytest.fixture(scope="module")
def tiny_model():
    from flax import nnx

    return vsurge.LlamaForCausalLM(TINY, rngs=nnx.Rngs(7))


def uncached_greedy(model, prompt, steps):
    from flax import nnx

    forward = nnx.jit(lambda m, ids: m(ids)[0])
    ids = list(prompt)
    for _ in range(steps):  # causal: right padding to one width does not change earlier logits
        padded = np.zeros((1, 64), np.int32)
        padded[0, : len(ids)] = ids
        logits = forward(model, jnp.asarray(padded))
        ids.append(int(np.argmax(np.asarray(logits)[0, len(ids) - 1])))
    return ids[len(prompt):]


@pytest.mark.parametrize("prompt_len", [1, 5, 16, 17])
def test_cached_greedy_equals_uncached(tiny_model, prompt_len):
    prompt = list(np.random.default_rng(prompt_len).integers(0, TINY.vocab_size, prompt_len))
    assert greedy_generate(tiny_model, prompt, max_new_tokens=12) == uncached_greedy(tiny_model, prompt, 12)


def test_stop_token_ends_generation(tiny_model):
    prompt = [3, 1, 4, 1, 5]
    free = greedy_generate(tiny_model, prompt, max_new_tokens=10)
    stop = free[3]
    stopped = greedy_generate(tiny_model, prompt, max_new_tokens=10, stop_token_ids=[stop])
    assert stopped == free[: free.index(stop) + 1]


def test_sampling_is_seeded(tiny_model):
    gen = Generator(tiny_model, max_length=64)
    a = gen.generate([1, 2, 3], 16, temperature=5.0, seed=11)
    b = gen.generate([1, 2, 3], 16, temperature=5.0, seed=11)
    c = gen.generate([1, 2, 3], 16, temperature=5.0, seed=12)
    assert a == b and a != c


def test_context_limits(tiny_model):
    gen = Generator(tiny_model, max_length=32)
    with pytest.raises(ValueError, match="empty"):
        gen.generate([], 4)
    with pytest.raises(ValueError, match="40 tokens.*at most 31"):
        gen.generate(list(range(40)), 4)
    assert len(gen.generate(list(range(28)), 100)) == 4  # clipped to the context


def test_bucket_length():
    assert [bucket_length(n) for n in (1, 16, 17, 100)] == [16, 16, 32, 128]
