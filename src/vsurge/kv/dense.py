"""Dense KV cache: one contiguous (max_length) region per batch row.

Rows are left-aligned: token t of a row sits at position t, so causality alone
(key position <= query position) hides both the unwritten tail and stale
entries of a reused row. Writes are scatters into the donated buffer: one
step writes only its new tokens, never copies the cache.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ..config import ModelConfig
from ..ops.attention import attend


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class NoCache:
    """Causal attention within the given tokens only (plain forward pass)."""

    sliding_window: int | None = dataclasses.field(default=None, metadata=dict(static=True))

    def attend(self, layer, q, k, v, positions):
        k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)  # (B, KVH, T, hd)
        return attend(q, k, v, positions, positions, self.sliding_window), self


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DenseKVCache:
    k: jax.Array  # (L, B, KVH, S, hd): each head's keys contiguous for the decode dot
    v: jax.Array  # (L, B, KVH, S, hd)
    # True while prefilling rows whose cache is empty: attend over the new
    # tokens only instead of the whole max_length region.
    fresh: bool = dataclasses.field(default=False, metadata=dict(static=True))
    sliding_window: int | None = dataclasses.field(default=None, metadata=dict(static=True))
    # Decode reads keys/values [0, window) only: every position the batch can attend to
    # lies below it, so the rest of the region is never read. None = the whole region.
    window: int | None = dataclasses.field(default=None, metadata=dict(static=True))

    @classmethod
    def init(cls, config: ModelConfig, batch_size: int, max_length: int, dtype=jnp.float32):
        shape = (config.num_layers, batch_size, config.num_kv_heads, max_length, config.head_dim)
        return cls(
            k=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            sliding_window=config.sliding_window,
        )

    @property
    def max_length(self) -> int:
        return self.k.shape[3]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def with_mode(self, fresh: bool) -> "DenseKVCache":
        return dataclasses.replace(self, fresh=fresh)

    def with_window(self, window: int | None) -> "DenseKVCache":
        return dataclasses.replace(self, window=window)

    def attend(self, layer, q, k, v, positions):
        """q: (B, T, H, hd), k/v: (B, T, KVH, hd), positions: (B, T).

        B may be smaller than the cache's batch: the call then works on the first B rows
        only (an engine decoding just its busy slots). Positions >= max_length are dropped
        from the write (padding rows).
        """
        k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)  # (B, KVH, T, hd)
        rows = jnp.arange(k.shape[0])[:, None, None]  # (B, 1, 1)
        heads = jnp.arange(k.shape[1])[None, :, None]  # (1, KVH, 1)
        where = (layer, rows, heads, positions[:, None, :])
        new_k = self.k.at[where].set(k.astype(self.k.dtype), mode="drop")
        new_v = self.v.at[where].set(v.astype(self.v.dtype), mode="drop")
        cache = dataclasses.replace(self, k=new_k, v=new_v)
        if self.fresh:
            return attend(q, k, v, positions, positions, self.sliding_window), cache
        span = self.max_length if self.window is None else min(self.window, self.max_length)
        start = (layer, 0, 0, 0, 0)
        size = (1, k.shape[0], new_k.shape[2], span, new_k.shape[4])
        layer_k = jax.lax.dynamic_slice(new_k, start, size)[0]  # (B, KVH, span, hd)
        layer_v = jax.lax.dynamic_slice(new_v, start, size)[0]
        key_pos = jnp.broadcast_to(jnp.arange(span, dtype=jnp.int32), (k.shape[0], span))
        return attend(q, layer_k, layer_v, positions, key_pos, self.sliding_window), cache
