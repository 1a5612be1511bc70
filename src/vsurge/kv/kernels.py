"""JAX's own Pallas paged-attention kernels for decode rows, behind `kv/paged.paged_attention`.

    gpu   jax.experimental.pallas.ops.gpu.paged_attention (Triton): one query per row, GQA, soft-cap;
          no sliding window, no sinks, no local chunks
    tpu   jax.experimental.pallas.ops.tpu.ragged_paged_attention: GQA, sliding window, soft-cap;
          no sinks, no local chunks
    xla   kv/paged.py's page-column loop: everything else (CPU, prompt rows, sinks, local chunks, dk != dv,
          int8 / fp8 pages: kv/quant.py)

`kernel_for` picks one at trace time. They are opt-in (VSURGE_PAGED_KERNEL=pallas) until the
cache is stored in their layouts: our pages are (P, KVH, dk, ps) keys and (P, KVH, ps, dv) values
(what the XLA path reads fastest on CPU), the GPU kernel reads (KVH, P, ps, d) and the TPU one
(P, ps, 2 KVH, d) with keys and values interleaved, so each call here first transposes every page
of the layer: correct, and what the tests check in interpret mode, but a copy of the whole layer's
cache per step on a device.
"""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp

from ..config import AttentionSpec

KERNELS = ("gpu", "tpu")


def kernel_for(backend: str, q_len: int, k_dim: int, v_dim: int, spec: AttentionSpec, sinks) -> str | None:
    """The kernel that serves decode rows of this layer on `backend`, or None (the XLA path)."""
    if os.environ.get("VSURGE_PAGED_KERNEL", "xla") != "pallas":
        return None
    return supported(backend, q_len, k_dim, v_dim, spec, sinks)


def supported(backend: str, q_len: int, k_dim: int, v_dim: int, spec: AttentionSpec, sinks) -> str | None:
    if q_len != 1 or k_dim != v_dim or sinks is not None or spec.chunk is not None or backend not in KERNELS:
        return None
    if backend == "gpu" and spec.window is not None:
        return None
    return backend


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


def tpu_inputs(q, k_pages, v_pages, tables, q_pos):
    """Our decode rows as the TPU kernel's arguments: (queries (R, H, d), kv_pages (P, ps, 2 KVH, d)
    with keys at even heads and values at odd ones, kv_lens (R,), page_indices (R, W), cu_q_lens
    (R + 1,), num_seqs (1,))."""
    r = tables.shape[0]
    p, kvh, d, ps = k_pages.shape
    keys = jnp.transpose(k_pages, (0, 3, 1, 2))  # (P, ps, KVH, d)
    values = jnp.transpose(v_pages, (0, 2, 1, 3))
    kv = jnp.stack([keys, values], axis=3).reshape(p, ps, 2 * kvh, d)
    kv_lens = jnp.maximum(q_pos[:, 0] + 1, 1).astype(jnp.int32)  # (a padding row reads one key: discarded)
    return q[:, 0], kv, kv_lens, tables, jnp.arange(r + 1, dtype=jnp.int32), jnp.asarray([r], jnp.int32)


def tpu_decode(q, k_pages, v_pages, tables, q_pos, spec: AttentionSpec, reference: bool = False):
    """As gpu_decode, through the TPU ragged paged-attention kernel (one query token per sequence), or
    with `reference` through that module's own pure-JAX reference on the same arguments. (The kernel
    cannot run in TPU interpret mode on CPU with jax 0.10.2: it reshapes a VMEM ref after its DMA,
    and the interpreter's `to_range` handles indexer transforms only.)"""
    from jax.experimental.pallas.ops.tpu import ragged_paged_attention as rpa

    args = tpu_inputs(q, k_pages, v_pages, tables, q_pos)
    options = dict(sm_scale=spec.scale, sliding_window=spec.window, soft_cap=spec.softcap)
    if reference:
        return rpa.ref_ragged_paged_attention(*args, **options)[:, None]
    return rpa.ragged_paged_attention(*args, **options, num_kv_pages_per_block=math.gcd(tables.shape[1], 8),
                                      num_queries_per_block=8)[:, None]


def decode(kernel: str, q, k_pages, v_pages, tables, q_pos, spec: AttentionSpec):
    return (gpu_decode if kernel == "gpu" else tpu_decode)(q, k_pages, v_pages, tables, q_pos, spec)


