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

from ..decoding import decode_step, is_eos, prefill_first_token
from ..ops.sampling import SamplingArrays
from .state import DecodeState


def prefill(graphdef, graphstate, graphother, tokens, lengths, sampling: SamplingArrays, bias, eos, max_new,
            *, cache_length: int, max_new_cap: int) -> DecodeState:
    """tokens (B, T) right-padded, lengths (B,) -> state holding each row's first generated token."""
    model = nnx.merge(graphdef, graphstate, graphother)
    b = tokens.shape[0]
    first, counts, prompt_mask, cache, _ = prefill_first_token(model, tokens, lengths, sampling, bias, cache_length)
    return DecodeState(
        sequences=jnp.zeros((b, max_new_cap), jnp.int32).at[:, 0].set(first),
        generated=jnp.ones((b,), jnp.int32),
        running_token=first,
        position=lengths.astype(jnp.int32),
        finished=is_eos(first, eos) | (max_new <= 1),
        max_new=max_new,
        eos=eos,
        counts=counts,
        prompt_mask=prompt_mask,
        bias=bias,
        sampling=sampling,
        cache=cache,
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
        active = ~s.finished
        token, generated, done, counts, cache, _ = decode_step(
            model, s.running_token, s.position, active, s.generated, s.max_new, s.eos, s.counts, s.prompt_mask,
            s.bias, s.sampling, s.cache)
        write_at = jnp.where(active, s.generated, cap)  # out of range = dropped for finished rows
        s = dataclasses.replace(
            s,
            sequences=s.sequences.at[rows, write_at].set(token, mode="drop"),
            generated=generated,
            running_token=token,
            position=s.position + active,
            finished=s.finished | done,
            counts=counts,
            cache=cache,
        )
        return step + 1, s

    _, state = jax.lax.while_loop(keep_going, one_step, (jnp.int32(0), state))
    return state
