"""Dense KV cache: one contiguous (max_length) region per batch row, one array per layer.

Rows are left-aligned: token t of a row sits at position t, so causality alone
(key position <= query position) hides both the unwritten tail and stale
entries of a reused row. Writes are scatters into the donated buffers: one
step writes only its new tokens, never copies the cache. This is the cache of
the seed's `prefill` (a prompt's K/V apart, seed/engines.py) and of the tests' reference
path (tests/dense_generator.py); the engines use paged.py.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from ..config import AttentionSpec, KVLayer, StateLayer
from ..ops.attention import attend
from . import quant
from .access import KEY_AXIS, VALUE_AXIS, write_tokens
from .recurrent import init_states, replace_part, run_fresh


def _transposed(k):
    """(B, T, KVH, hd) -> (B, KVH, hd, T): the key layout attention reads."""
    return k.transpose(0, 2, 3, 1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class NoCache:
    """Causal attention within the given tokens only (plain forward pass)."""

    def attend(self, layer, q, k, v, positions, spec: AttentionSpec, sinks=None):
        return attend(q, _transposed(k), v.swapaxes(1, 2), positions, positions, spec, sinks), self

    def recurrent(self, index, part, op, inputs, positions, shape):
        """Every row from a zero state (kv/recurrent.py); nothing kept."""
        return run_fresh(op, inputs, shape, positions >= 0), self


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DenseKVCache:
    # logical axes (hardware/sharding.py): KV heads split over `model`
    K_AXES: ClassVar[tuple[str, ...]] = ("batch", "kv_heads", "head_dim", "sequence")
    V_AXES: ClassVar[tuple[str, ...]] = ("batch", "kv_heads", "sequence", "head_dim")

    k: list  # per attention layer (B, KVH, dk, S): keys transposed for the query-key dot
    v: list  # per attention layer (B, KVH, S, dv)
    # per recurrent layer {part: (B, ...) f32} (kv/recurrent.py)
    states: list = dataclasses.field(default_factory=list)
    # (B,) i32 while prefilling right-padded rows: tokens at or past a row's length do not enter
    # its recurrent states; None: every token does
    lengths: jax.Array | None = None
    # True while prefilling rows whose cache is empty: attend over the new
    # tokens only instead of the whole max_length region.
    fresh: bool = dataclasses.field(default=False, metadata=dict(static=True))
    # positions the cache holds (static: a model without attention layers, plain Mamba-2, has no k/v)
    length: int = dataclasses.field(default=0, metadata=dict(static=True))

    @classmethod
    def init(cls, layout: tuple[KVLayer, ...], batch_size: int, max_length: int, dtype=jnp.float32,
             state_layout: tuple[StateLayer, ...] = ()):
        """layout: the model's per-layer KV shapes (`config.kv_layout`); dtype: the storage dtype
        (int8 / float8: quantized, head_dim + 2 with the scales, kv/quant.py); state_layout: its
        recurrent layers' states (`config.state_layout`)."""
        dim = lambda d: quant.stored_dim(d, dtype)  # noqa: E731
        return cls(k=[jnp.zeros((batch_size, l.heads, dim(l.k_dim), max_length), dtype) for l in layout],
                   v=[jnp.zeros((batch_size, l.heads, max_length, dim(l.v_dim)), dtype) for l in layout],
                   states=init_states(state_layout, batch_size), length=max_length)

    @property
    def max_length(self) -> int:
        return self.length

    @property
    def batch_size(self) -> int:
        return self.v[0].shape[0] if self.v else next(iter(self.states[0].values())).shape[0]

    def with_mode(self, fresh: bool, lengths=None) -> "DenseKVCache":
        return dataclasses.replace(self, fresh=fresh, lengths=lengths)

    def recurrent(self, index, part, op, inputs, positions, shape):
        """Each batch row carries its own state; right padding (past `lengths`) leaves it as it was."""
        valid = (positions >= 0) & (positions < self.max_length)
        if self.lengths is not None:
            valid &= positions < self.lengths[:, None]
        out, new = op(inputs, self.states[index][part], valid)
        return out, dataclasses.replace(self, states=replace_part(self.states, index, part, new))

    def attend(self, layer, q, k, v, positions, spec: AttentionSpec, sinks=None):
        """q: (B, T, H, dk), k: (B, T, KVH, dk), v: (B, T, KVH, dv), positions: (B, T). Positions
        >= max_length are dropped from the write (padding rows)."""
        b, t = positions.shape
        rows = jnp.repeat(jnp.arange(b, dtype=jnp.int32), t)  # (B * T,): each token's row, as a page
        slots, flat = positions.reshape(-1), lambda a: a.reshape(b * t, *a.shape[2:])  # noqa: E731
        k_cache = write_tokens(self.k[layer], rows, slots, flat(k), KEY_AXIS)
        v_cache = write_tokens(self.v[layer], rows, slots, flat(v), VALUE_AXIS)
        cache = dataclasses.replace(self, k=_replace(self.k, layer, k_cache), v=_replace(self.v, layer, v_cache))
        if self.fresh:  # the new tokens' own K/V (a quantized cache is read back from the next step on)
            return attend(q, _transposed(k), v.swapaxes(1, 2), positions, positions, spec, sinks), cache
        key_pos = jnp.broadcast_to(jnp.arange(self.max_length, dtype=jnp.int32), (k.shape[0], self.max_length))
        # int8 / fp8: the whole region dequantized (the plain reference path, not the engines')
        return attend(q, *quant.expand(k_cache, v_cache, q.dtype), positions, key_pos, spec, sinks), cache


def _replace(arrays: list, index: int, value) -> list:
    out = list(arrays)
    out[index] = value
    return out
