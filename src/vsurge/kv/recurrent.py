"""Recurrent layers' per-sequence state, held beside the KV cache (linear attention, Mamba-2, short
convolutions).

A recurrent layer (`config.layer_kind(i)` neither "attention" nor "mlp") keeps a fixed-size state per sequence
instead of keys and values; its `StateLayer` (config.py) names the parts, e.g. a convolution's
window of past inputs ("conv") and a delta-rule or SSM state ("ssm"). Every cache holds them per
row: the dense cache per batch row, the paged pool per sequence slot (S+1 rows, the last the spare
row that padding rows write), and the passes without a cache start each row from zeros and keep
nothing. A layer asks its cache to run one recurrent op over the step's tokens:

    out, cache = cache.recurrent(state_index, part, op, inputs, positions, shape)

`op(inputs, state, valid) -> (out, state)` works on rows of tokens: inputs a tuple of (R, T, ...)
arrays, state (R, ...) float32, valid (R, T) bool, True on a prefix of each row (a False token must
leave the state as it was); `shape` is the part's shape (the `StateLayer`'s), for caches that start
from zeros. The cache decides which rows those are and where their states live.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..config import StateLayer


def init_states(layout: tuple[StateLayer, ...], rows: int) -> list[dict]:
    """Zero states of every recurrent layer for `rows` rows: per layer {part: (rows, *shape) f32}."""
    return [{name: jnp.zeros((rows, *shape), jnp.float32) for name, shape in layer.parts} for layer in layout]


def by_length(chunked, step):
    """One op from a prompt form `chunked(inputs, state, valid)` and a one-token form
    `step(inputs (R, ...), state, valid (R,))`: rows of one token (decode) take the step form."""
    def op(inputs, state, valid):
        if inputs[0].shape[1] != 1:
            return chunked(inputs, state, valid)
        out, state = step(tuple(a[:, 0] for a in inputs), state, valid[:, 0])
        return out[:, None], state
    return op


def replace_part(states: list[dict], index: int, part: str, value) -> list[dict]:
    out = list(states)
    out[index] = {**states[index], part: value}
    return out


def _at_slots(op, inputs, states, slots, positions):
    """Rows of sequences held at `slots` (R,) of `states` (S+1, ...): positions (R, T), -1 = padding;
    a row whose first token is position 0 starts its sequence, from a zero state."""
    start = states[slots]
    fresh = positions[:, 0] == 0
    start = jnp.where(fresh.reshape(-1, *(1,) * (start.ndim - 1)), 0.0, start)
    out, new = op(inputs, start, positions >= 0)
    return out, states.at[slots].set(new)


def run_packed(op, inputs, states, layout):
    """The engines' packed step (kv/paged.py): inputs (1, N, ...) = D decode tokens, then P chunk rows
    of C tokens; states (S+1, ...) by slot -> (out (1, N, ...), states). Chunk rows run one after
    another: a long prompt's consecutive rows in one step carry its state from row to row."""
    d, (p, c) = layout.num_decode, layout.chunk_pos.shape
    parts = []
    if d:
        rows = tuple(a[0, :d, None] for a in inputs)  # (D, 1, ...)
        out, states = _at_slots(op, rows, states, layout.decode_slots, layout.decode_pos)
        parts.append(out[:, 0])
    if p:
        rows = tuple(a[0, d:].reshape(p, c, *a.shape[2:]) for a in inputs)  # (P, C, ...)

        def one_row(states, row):
            xs, slot, positions = row
            out, states = _at_slots(op, tuple(a[None] for a in xs), states, slot[None], positions[None])
            return states, out[0]

        if p == 1:  # one row: no loop to compile
            states, out = one_row(states, (tuple(a[0] for a in rows), layout.chunk_slots[0], layout.chunk_pos[0]))
            out = out[None]
        else:
            states, out = jax.lax.scan(one_row, states, (rows, layout.chunk_slots, layout.chunk_pos))
        parts.append(out.reshape(p * c, *out.shape[2:]))
    return (jnp.concatenate(parts) if len(parts) > 1 else parts[0])[None], states


def run_fresh(op, inputs, shape: tuple[int, ...], valid):
    """Rows (B, T) that start from zero states and keep nothing (passes without a cache)."""
    out, _ = op(inputs, jnp.zeros((inputs[0].shape[0], *shape), jnp.float32), valid)
    return out
