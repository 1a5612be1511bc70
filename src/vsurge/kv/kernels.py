"""JAX's own Pallas paged-attention kernel for decode rows on a GPU (the gpu attention backend, kv/backends).

    gpu   jax.experimental.pallas.ops.gpu.paged_attention (Triton): one query per row, GQA, soft-cap;
          no sliding window, no sinks, no local chunks

It reads (KVH, P, ps, d) pages, so each call first transposes every page of the layer from the column
layout (P, KVH, dk, ps) keys / (P, KVH, ps, dv) values: correct, and what the tests check in interpret mode,
but a copy of the whole layer's cache per step; hence opt-in (--attention-backend gpu). The TPU's kernel
reads its own layout, which the tpu backend stores (kv/backends/tpu.py).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from ..config import AttentionSpec


def gpu_serves(q_len: int, k_dim: int, v_dim: int, spec: AttentionSpec, sinks) -> bool:
    """Whether the Triton kernel computes this layer's decode rows (else the XLA loop)."""
    return q_len == 1 and k_dim == v_dim and sinks is None and spec.chunk is None and spec.window is None


def gpu_decode(q, k_pages, v_pages, tables, q_pos, spec: AttentionSpec, interpret: bool = False):
    """q (R, 1, H, d); k_pages (P, KVH, d, ps); v_pages (P, KVH, ps, d); tables (R, W); q_pos (R, 1)
    (-1: padding) -> (R, 1, H, d) through the Triton paged-attention kernel."""
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention

    r, w = tables.shape
    k_splits = math.gcd(w, 16)  # the kernel splits each table into k_splits equal partitions
    per_block = math.gcd(w // k_splits, 8)
    lengths = jnp.maximum(q_pos[:, 0] + 1, 0).astype(jnp.int32)  # keys [0, position] are visible
    out = paged_attention((q[:, 0] * spec.scale).astype(q.dtype), jnp.transpose(k_pages, (1, 0, 3, 2)),
                          jnp.transpose(v_pages, (1, 0, 2, 3)), tables, lengths, k_splits=k_splits,
                          pages_per_compute_block=per_block, attn_logits_soft_cap=spec.softcap,
                          interpret=interpret)
    return out[:, None]
