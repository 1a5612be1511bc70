"""The page-column layout: keys (P, KVH, dk, ps), values (P, KVH, ps, dv) (what XLA:CPU and vsurge's C++
kernels read fastest). Each token's K/V is scattered into its slot (kv/access.py) before attention, so a chunk
row sees the keys of earlier chunk rows of its sequence written in the same step; attention walks each row's
page table one page column at a time (kv/paged.py)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from .. import quant
from ..access import KEY_AXIS, VALUE_AXIS, write_tokens


@dataclasses.dataclass(frozen=True)
class ColumnPages:
    name: str
    kernel: str | None  # what serves decode rows where it can (kv/paged.paged_attention): "cpp", "gpu", None

    K_AXES = ("pages", "kv_heads", "head_dim", "page_offset")
    V_AXES = ("pages", "kv_heads", "page_offset", "head_dim")

    def init_pools(self, layers, num_pages: int, page_size: int, dtype) -> tuple[list, list]:
        dim = lambda d: quant.stored_dim(d, dtype)  # noqa: E731  (int8: with its scales)
        return ([jnp.zeros((num_pages, l.heads, dim(l.k_dim), page_size), dtype) for l in layers],
                [jnp.zeros((num_pages, l.heads, page_size, dim(l.v_dim)), dtype) for l in layers])

    def attend(self, cache, layer, q, k, v, spec, sinks):
        """q (1, N, H, dk), k (1, N, KVH, dk), v (1, N, KVH, dv) -> ((1, N, H, dv), the cache written)."""
        from ..paged import paged_attention

        lay, ps = cache.layout, cache.page_size
        page, offset = lay.slot_mapping // ps, lay.slot_mapping % ps  # page num_pages: dropped
        # each token's vector of each head (int8 / fp8: with its scale)
        k_pages = write_tokens(cache.k[layer], page, offset, k[0], KEY_AXIS)
        v_pages = write_tokens(cache.v[layer], page, offset, v[0], VALUE_AXIS)
        cache = with_layer(cache, layer, k_pages, v_pages)
        d, (p, c) = lay.num_decode, lay.chunk_pos.shape
        heads, dv = q.shape[2], v.shape[-1]
        parts = []
        if d:
            qd = q[0, :d, None]  # (D, 1, H, dk)
            parts.append(paged_attention(qd, k_pages, v_pages, lay.decode_tables, lay.decode_pos, spec, sinks,
                                         lay.num_columns, kernel=self.kernel).reshape(d, heads, dv))
        if p:
            qc = q[0, d:].reshape(p, c, *q.shape[2:])  # (P, C, H, dk)
            parts.append(paged_attention(qc, k_pages, v_pages, lay.chunk_tables, lay.chunk_pos, spec, sinks,
                                         lay.num_columns, lay.chunk_limit, kernel=self.kernel).reshape(p * c, heads, dv))
        out = jnp.concatenate(parts)[None] if len(parts) > 1 else parts[0][None]
        return out, cache


def with_layer(cache, layer: int, k_pool, v_pool):
    """The cache with layer `layer`'s key and value pools replaced (every backend's writes)."""
    k, v = list(cache.k), list(cache.v)
    k[layer], v[layer] = k_pool, v_pool
    return dataclasses.replace(cache, k=k, v=v)


CPU = ColumnPages("cpu", "cpp")
XLA = ColumnPages("xla", None)
GPU = ColumnPages("gpu", "gpu")
