"""Paged KV cache: fixed-size pages shared by every sequence, found through page tables.

One step of the paged engine runs a packed row of N tokens (1, N): first
`num_decode` single tokens (one per decoding sequence), then one prefill
chunk of C tokens. Each token's K/V is scattered into its page slot
(`slot_mapping`); attention then gathers each sequence's pages in order, so
key position = index in the gathered row and causality (key pos <= query
pos) hides unwritten slots and table padding. `gather_attend` is the one
function a fused paged-attention kernel would replace.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ..config import ModelConfig
from ..ops.attention import attend


def page_bytes(config: ModelConfig, page_size: int, dtype) -> int:
    """Bytes one page takes over all layers, keys and values."""
    return 2 * config.num_layers * page_size * config.num_kv_heads * config.head_dim * jnp.dtype(dtype).itemsize


def gather_attend(q, pages_k, pages_v, layer, tables, q_pos, sliding_window):
    """q (R, T, H, hd); pages_k/v (L, P, ps, KVH, hd); tables (R, W) page ids in order;
    q_pos (R, T) -> (R, T, H, hd). Gathers only the tables' pages of `layer`."""
    r, w = tables.shape
    ps, kvh, hd = pages_k.shape[2:]
    k = pages_k[layer, tables].reshape(r, w * ps, kvh, hd).swapaxes(1, 2)  # (R, KVH, W*ps, hd)
    v = pages_v[layer, tables].reshape(r, w * ps, kvh, hd).swapaxes(1, 2)
    k_pos = jnp.broadcast_to(jnp.arange(w * ps, dtype=jnp.int32), (r, w * ps))
    return attend(q, k, v, q_pos, k_pos, sliding_window)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PagedAttentionCache:
    k: jax.Array  # (L, num_pages, page_size, KVH, hd)
    v: jax.Array  # (L, num_pages, page_size, KVH, hd)
    # per step (set by the engine before the forward pass; empty between steps)
    slot_mapping: jax.Array | None = None  # (N,) page * page_size + offset; >= num_pages * page_size = skip
    tables: jax.Array | None = None  # (num_decode + 1, W): decode rows' tables, then the prefill chunk's
    num_decode: int = dataclasses.field(default=0, metadata=dict(static=True))
    sliding_window: int | None = dataclasses.field(default=None, metadata=dict(static=True))

    @classmethod
    def init(cls, config: ModelConfig, num_pages: int, page_size: int, dtype=jnp.float32):
        shape = (config.num_layers, num_pages, page_size, config.num_kv_heads, config.head_dim)
        return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), sliding_window=config.sliding_window)

    @property
    def page_size(self) -> int:
        return self.k.shape[2]

    def for_step(self, slot_mapping, tables, num_decode: int) -> "PagedAttentionCache":
        return dataclasses.replace(self, slot_mapping=slot_mapping, tables=tables, num_decode=num_decode)

    def storage_only(self) -> "PagedAttentionCache":
        return dataclasses.replace(self, slot_mapping=None, tables=None, num_decode=0)

    def attend(self, layer, q, k, v, positions):
        """q (1, N, H, hd), k/v (1, N, KVH, hd), positions (1, N): decode tokens, then one prefill chunk."""
        ps = self.page_size
        # scatter straight into the 5-D pages (a reshape of the scan carry would make XLA copy it)
        where = (layer, self.slot_mapping // ps, self.slot_mapping % ps)  # page num_pages = dropped
        new_k = self.k.at[where].set(k[0].astype(self.k.dtype), mode="drop")
        new_v = self.v.at[where].set(v[0].astype(self.v.dtype), mode="drop")
        d = self.num_decode
        parts = []
        if d:
            qd = q[0, :d, None]  # (D, 1, H, hd)
            parts.append(gather_attend(qd, new_k, new_v, layer, self.tables[:d], positions[0, :d, None],
                                       self.sliding_window)[:, 0])  # (D, H, hd)
        if q.shape[1] > d:
            qp = q[:, d:]  # (1, C, H, hd)
            parts.append(gather_attend(qp, new_k, new_v, layer, self.tables[d:], positions[:, d:],
                                       self.sliding_window)[0])  # (C, H, hd)
        out = jnp.concatenate(parts, axis=0)[None] if len(parts) > 1 else parts[0][None]
        return out, dataclasses.replace(self, k=new_k, v=new_v)
