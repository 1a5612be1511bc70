"""The two compiled programs of vInference: prefill (prompt -> first token) and a decode chunk.

A decode chunk is an on-device `lax.while_loop` of up to `num_steps` tokens
that exits early once every row is finished; the host sees the batch once
per chunk. The state (KV cache included) is donated, so it is updated in place.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from ..kv import DenseKVCache
from ..ops.sampling import SamplingArrays, sample
from .state import DecodeState


def _is_eos(tokens, eos):
    """tokens (B,), eos (B, E) -> (B,) bool."""
    return jnp.any(tokens[:, None] == eos, axis=-1)


def prefill(graphdef, graphstate, graphother, tokens, lengths, sampling: SamplingArrays, bias, eos, max_new,
            *, cache_length: int, max_new_cap: int) -> DecodeState:
    """tokens (B, T) right-padded, lengths (B,) -> state holding each row's first generated token."""
    model = nnx.merge(graphdef, graphstate, graphother)
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
    return DecodeState(
        sequences=jnp.zeros((b, max_new_cap), jnp.int32).at[:, 0].set(first),
        generated=jnp.ones((b,), jnp.int32),
        running_token=first,
        position=lengths.astype(jnp.int32),
        finished=_is_eos(first, eos) | (max_new <= 1),
        max_new=max_new,
        eos=eos,
        counts=counts.at[rows, first].add(1),
        prompt_mask=prompt_mask,
        bias=bias,
        sampling=sampling,
        cache=cache.with_mode(False),
    )


def decode_chunk(graphdef, graphstate, graphother, state: DecodeState, *, num_steps: int) -> DecodeState:
    """Run up to `num_steps` decode steps on the device; stop early when all rows are finished."""
    model = nnx.merge(graphdef, graphstate, graphother)
    rows = jnp.arange(state.generated.shape[0])
    cap = state.sequences.shape[1]

    def keep_going(carry):
        step, s = carry
        return (step < num_steps) & ~jnp.all(s.finished)

    def one_step(carry):
        step, s = carry
        logits, cache = model(s.running_token[:, None], s.position[:, None], s.cache)
        token = sample(logits[:, 0], s.counts, s.prompt_mask, s.sampling, s.generated, s.bias)
        active = ~s.finished
        token = jnp.where(active, token, s.running_token)
        write_at = jnp.where(active, s.generated, cap)  # out of range = dropped for finished rows
        generated = s.generated + active
        done = active & (_is_eos(token, s.eos) | (generated >= s.max_new))
        s = dataclasses.replace(
            s,
            sequences=s.sequences.at[rows, write_at].set(token, mode="drop"),
            generated=generated,
            running_token=token,
            position=s.position + active,
            finished=s.finished | done,
            counts=s.counts.at[rows, token].add(active.astype(jnp.int32)),
            cache=cache,
        )
        return step + 1, s

    _, state = jax.lax.while_loop(keep_going, one_step, (jnp.int32(0), state))
    return state
