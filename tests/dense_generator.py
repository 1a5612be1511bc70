"""The reference path: a model run alone, one prompt at a time, through a dense KV cache (prefill +
cached one-token decode steps), none of the engines' scheduling, pages or buckets. The engines' tests
check their tokens against `greedy_generate` (or reference_generation.greedy_reference, the same in a
short context), benchmarks/decode.py times its decode step. It lives in tests/, not in the package:
vsurge has one way in from Python (vSurge). Prompts are padded to power-of-two buckets and the cache
has a fixed length, so a session compiles a handful of shapes once.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vsurge.engine.engine_config import DEFAULT_MAX_LENGTH
from vsurge.hardware.sharding import create_state, mesh_of
from vsurge.kv.dense import DenseKVCache
from vsurge.kv.quant import storage_dtype
from vsurge.ops.sampling import greedy_tokens


def bucket_length(n: int, minimum: int = 16) -> int:
    """Smallest power of two >= n (and >= minimum)."""
    size = minimum
    while size < n:
        size *= 2
    return size


def _pick(logits: jax.Array, key: jax.Array, temperature: jax.Array) -> jax.Array:
    """logits (B, V) -> (B,) int32; temperature 0 is exactly argmax."""
    greedy = greedy_tokens(logits)
    scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
    sampled = jax.random.categorical(key, scaled, axis=-1)
    return jnp.where(temperature > 0, sampled, greedy).astype(jnp.int32)


@partial(jax.jit, static_argnums=0, donate_argnames="cache")
def _prefill(graphdef, state, tokens, lengths, cache, key, temperature):
    """tokens (B, T) right-padded, lengths (B,) -> first sampled token (B,), cache."""
    model = nnx.merge(graphdef, state)
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits, cache = model(tokens, positions, cache.with_mode(True, lengths), logits_index=lengths - 1)
    return _pick(logits, key, temperature), logits, cache.with_mode(False)


@partial(jax.jit, static_argnums=0, donate_argnames="cache")
def _decode(graphdef, state, tokens, positions, cache, key, temperature):
    """tokens, positions (B, 1) -> next token (B,), logits (B, V), cache."""
    model = nnx.merge(graphdef, state)
    logits, cache = model(tokens, positions, cache)
    logits = logits[:, 0]
    return _pick(logits, key, temperature), logits, cache


@dataclasses.dataclass
class Generator:
    """Single-stream generation for one model; reuses its compiled steps across calls."""

    model: nnx.Module
    max_length: int = DEFAULT_MAX_LENGTH
    kv_cache_dtype: str | None = None  # None / "auto": the model dtype; bfloat16 / float16 cast; int8 / fp8 quantized (kv/quant.py)

    def __post_init__(self):
        self.max_length = min(self.max_length, self.model.config.max_position_embeddings)
        self.model = self.model.for_context(self.max_length)
        self.graphdef, self.state = nnx.split(self.model)

    def stream(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        seed: int = 0,
        stop_token_ids: Sequence[int] = (),
    ) -> Iterator[int]:
        """Yield generated token ids one by one; stops after a stop token (which is yielded)."""
        n = len(prompt_ids)
        if n == 0:
            raise ValueError("the prompt is empty")
        if n >= self.max_length:
            raise ValueError(f"the prompt has {n} tokens but the context holds at most {self.max_length - 1}")
        max_new_tokens = min(max_new_tokens, self.max_length - n)
        width = min(bucket_length(n), self.max_length)
        tokens = np.zeros((1, width), np.int32)
        tokens[0, :n] = prompt_ids
        dtype = storage_dtype(self.kv_cache_dtype, self.model.dtype)
        config = self.model.config
        cache = create_state(partial(DenseKVCache.init, config.kv_layout, 1, self.max_length, dtype,
                                     config.state_layout), mesh_of(self.model))  # on the model's mesh: split over KV heads
        key = jax.random.PRNGKey(seed)
        temp = jnp.full((1,), temperature, jnp.float32)
        key, sub = jax.random.split(key)
        token, _, cache = _prefill(self.graphdef, self.state, jnp.asarray(tokens),
                                   jnp.asarray([n], jnp.int32), cache, sub, temp)
        stops = set(int(s) for s in stop_token_ids)
        for step in range(max_new_tokens):
            value = int(token[0])
            yield value
            if value in stops or step + 1 == max_new_tokens:
                return
            key, sub = jax.random.split(key)
            position = jnp.full((1, 1), n + step, jnp.int32)
            token, _, cache = _decode(self.graphdef, self.state, token[:, None], position, cache, sub, temp)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int = 256, **kwargs) -> list[int]:
        return list(self.stream(prompt_ids, max_new_tokens, **kwargs))


def greedy_generate(model, prompt_ids: Sequence[int], max_new_tokens: int = 32,
                    stop_token_ids: Sequence[int] = ()) -> list[int]:
    """Greedy continuation of one prompt (the reference path for the engines' tests)."""
    return Generator(model).generate(prompt_ids, max_new_tokens, stop_token_ids=stop_token_ids)
