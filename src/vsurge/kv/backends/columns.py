"""The page-column layout: keys (P, KVH, dk, ps), values (P, KVH, ps, dv) (what XLA:CPU and vsurge's C++
kernels read fastest). Each token's K/V is scattered into its slot (kv/access.py) before attention, so a chunk
row sees the keys of earlier chunk rows of its sequence written in the same step; attention walks each row's
page table one page column at a time (kv/paged.py)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ... import kernels as cpp_kernels
from ...config import AttentionSpec
from ...ops.attention import group_queries, merge_into, merge_partials, partial_attend
from .. import cpu_attention, kernels, quant
from ..access import KEY_AXIS, VALUE_AXIS, read_pages, write_tokens


def paged_attention(q, k_pages, v_pages, tables, q_pos, spec: AttentionSpec, sinks=None, num_columns=None,
                    q_limit=None, kernel: str | None = "cpp"):
    """q (R, T, H, dk); k_pages (P, KVH, dk, ps); v_pages (P, KVH, ps, dv); tables (R, W) page ids
    in order; q_pos (R, T) -> (R, T, H, dv). Reads only the tables' pages: all W columns
    (unrolled: the fastest form), or the first `num_columns` (a dynamic scalar) in a loop.
    int8 pages (kv/quant.py: dk + 2, dv + 2 with their scales) are dequantized per column, right
    after its gather, and pages of another float dtype cast: only the pages read are expanded.
    q_limit (R, T): the last key position each query sees (ops/attention._visible), prompt rows of a
    model whose image tokens see their whole image; the XLA form serves those.
    kernel: what serves decode rows where it can (the backend's choice, kv/backends): "cpp" vsurge's C++
    kernel on a CPU, "gpu" JAX's Triton kernel, None the XLA loop."""
    if q_limit is not None:
        return xla_paged_attention(q, k_pages, v_pages, tables, q_pos, spec, sinks, num_columns, q_limit)
    if (kernel == "gpu" and v_pages.dtype == q.dtype  # (the Pallas kernel reads pages in q's own dtype only)
            and kernels.gpu_serves(q.shape[1], k_pages.shape[2], v_pages.shape[3], spec, sinks)):
        return kernels.gpu_decode(q, k_pages, v_pages, tables, q_pos, spec)
    if kernel == "cpp" and cpu_attention.usable(q, k_pages, v_pages, spec) and cpp_kernels.tracing_for_cpu():
        return cpu_attention.decode(q, k_pages, v_pages, tables, q_pos, spec, sinks)  # one C++ call on CPU
    return xla_paged_attention(q, k_pages, v_pages, tables, q_pos, spec, sinks, num_columns)


def xla_paged_attention(q, k_pages, v_pages, tables, q_pos, spec: AttentionSpec, sinks=None, num_columns=None,
                        q_limit=None):
    """paged_attention in XLA ops (every backend; the reference the kernels are tested against)."""
    dv = quant.logical_dim(v_pages.shape[-1], v_pages.dtype)
    return column_attention(q, lambda ids: read_pages(k_pages, v_pages, ids, q.dtype), k_pages.shape[1],
                            v_pages.shape[2], dv, tables, q_pos, spec, sinks, num_columns, q_limit)


def column_attention(q, read, kv_heads: int, page_size: int, dv: int, tables, q_pos, spec: AttentionSpec,
                     sinks=None, num_columns=None, q_limit=None):
    """Attention over pages one page column at a time (online softmax), whatever their layout:
    read(ids (R,)) -> that page of each row as keys (R, KVH, dk, ps) and values (R, KVH, ps, dv) in q's
    dtype. Shapes and arguments as paged_attention's."""
    r, w = tables.shape
    offsets = jnp.arange(page_size, dtype=jnp.int32)
    qg = group_queries(q, kv_heads)  # once for every column

    def column_part(column):
        k_pos = jnp.broadcast_to(column * page_size + offsets, (r, page_size))
        keys, values = read(tables[:, column])
        return partial_attend(qg, keys, values, q_pos, k_pos, spec, q_limit=q_limit)

    shape = (*q.shape[:3], dv)  # (R, T, H, dv)
    if num_columns is None:
        return merge_partials([column_part(c) for c in range(w)], shape, q.dtype, sinks)
    first = column_part(0)  # every row has at least one page
    acc = jax.lax.fori_loop(1, num_columns, lambda c, acc: merge_into(acc, column_part(c)), first)
    return merge_partials([acc], shape, q.dtype, sinks)


@dataclasses.dataclass(frozen=True)
class ColumnPages:
    name: str
    kernel: str | None  # what serves decode rows where it can (paged_attention above): "cpp", "gpu", None

    K_AXES = ("pages", "kv_heads", "head_dim", "page_offset")
    V_AXES = ("pages", "kv_heads", "page_offset", "head_dim")

    def pool_axes(self, k, v) -> tuple[tuple, tuple]:
        """The logical axes (hardware/sharding.py) of one layer's key and value arrays: every layer's alike."""
        return self.K_AXES, self.V_AXES

    @staticmethod
    def held_heads(layer, dtype) -> int:
        """KV heads the pool holds for `layer`: its own."""
        return layer.heads

    def init_pools(self, layers, num_pages: int, page_size: int, dtype) -> tuple[list, list]:
        dim = lambda d: quant.stored_dim(d, dtype)  # noqa: E731  (int8: with its scales)
        return ([jnp.zeros((num_pages, l.heads, dim(l.k_dim), page_size), dtype) for l in layers],
                [jnp.zeros((num_pages, l.heads, page_size, dim(l.v_dim)), dtype) for l in layers])

    def attend(self, cache, layer, q, k, v, spec, sinks):
        """q (1, N, H, dk), k (1, N, KVH, dk), v (1, N, KVH, dv) -> ((1, N, H, dv), the cache written)."""
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
