"""Device-side generation pieces shared by every engine (vInference, vEngine).

`prefill_first_token` runs prompts into a fresh KV cache and samples each
row's first token; `decode_step` advances every row by one token. Both are
traced inside the engines' compiled programs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .kv import DenseKVCache
from .ops.sampling import TOP_LOGPROBS, SamplingArrays, sample, token_logprobs


def is_eos(tokens, eos):
    """tokens (B,), eos (B, E) -> (B,) bool."""
    return jnp.any(tokens[:, None] == eos, axis=-1)


def maybe_logprobs(logits, tokens, wanted):
    """(chosen (B,), top_ids (B, K), top_values (B, K)) when any row wants them, else zeros (no work)."""
    b = tokens.shape[0]
    zeros = (jnp.zeros((b,), jnp.float32), jnp.zeros((b, TOP_LOGPROBS), jnp.int32),
             jnp.zeros((b, TOP_LOGPROBS), jnp.float32))
    if wanted is None:
        return zeros
    return jax.lax.cond(jnp.any(wanted), lambda: token_logprobs(logits, tokens), lambda: zeros)


def prefill_first_token(model, tokens, lengths, sampling: SamplingArrays, bias, cache_length: int,
                        want_logprobs=None):
    """tokens (B, T) right-padded, lengths (B,).

    Returns first (B,) i32, counts (B, V) i32 (first token counted), prompt_mask (B, V) bool,
    cache (a DenseKVCache of `cache_length`, ready for decoding), and the first token's
    logprobs (see maybe_logprobs) when `want_logprobs` (B,) is given."""
    b, t = tokens.shape
    rows = jnp.arange(b)
    cache = DenseKVCache.init(model.config, b, cache_length, model.dtype).with_mode(True)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits, cache = model(tokens, positions, cache, logits_index=lengths - 1)  # (B, V)
    vocab = logits.shape[-1]
    in_prompt = positions < lengths[:, None]  # (B, T)
    prompt_mask = jnp.zeros((b, vocab), bool).at[rows[:, None], tokens].max(in_prompt)
    counts = jnp.zeros((b, vocab), jnp.int32)
    first = sample(logits, counts, prompt_mask, sampling, jnp.zeros((b,), jnp.int32), bias)
    logprobs = maybe_logprobs(logits, first, want_logprobs)
    return first, counts.at[rows, first].add(1), prompt_mask, cache.with_mode(False), logprobs


def decode_step(model, token, position, active, generated, max_new, eos, counts, prompt_mask, bias,
                sampling: SamplingArrays, cache, want_logprobs=None):
    """Advance every row by one token; inactive rows keep their token and counters.

    token, position, generated, max_new (B,) i32; active (B,) bool; eos (B, E).
    Returns new token (B,), generated (B,), done (B,) (rows that finished now), counts, cache,
    logprobs (see maybe_logprobs)."""
    rows = jnp.arange(token.shape[0])
    logits, cache = model(token[:, None], position[:, None], cache)
    new = sample(logits[:, 0], counts, prompt_mask, sampling, generated, bias)
    new = jnp.where(active, new, token)
    generated = generated + active
    done = active & (is_eos(new, eos) | (generated >= max_new))
    counts = counts.at[rows, new].add(active.astype(jnp.int32))
    logprobs = maybe_logprobs(logits[:, 0], new, None if want_logprobs is None else want_logprobs & active)
    return new, generated, done, counts, cache, logprobs
