"""Decode rows' paged attention as one C++ call per layer on CPU (kernels/paged_attention.cc).

XLA runs a decode row's attention as ~25 small ops per layer (a page gather, two batched dots,
the online-softmax merge, a loop over columns), each with a fixed cost: at one row they took 13 of
a default-model token's 35 ms. The kernel reads each page the row sees once for the query heads
that share it. It serves decode rows (one query token) over float32 or bfloat16 pages in one
process without a device mesh, over float32, bfloat16, int8 or fp8 pages (those two dequantized
page by page with their scales, kv/quant.py's layout); prompt rows, other backends, sharded pools
and layers with local chunks (Llama 4) keep the XLA path. VSURGE_CPU_ATTENTION=0 turns it off
(benchmarks compare both).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from .. import kernels
from ..config import AttentionSpec
from . import quant

ENABLED = os.environ.get("VSURGE_CPU_ATTENTION", "1") != "0"
PAGE_DTYPES = tuple(jnp.dtype(d) for d in (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int8, jnp.float8_e4m3fn))


def usable(q, k_pages, v_pages, spec: AttentionSpec | None = None) -> bool:
    """q (R, T, H, dk), pages and the layer's spec as paged_attention takes them: whether the kernel
    serves this call (not for local chunks: the kernel knows windows only)."""
    if not (ENABLED and kernels.available()) or q.shape[1] != 1 or (spec and spec.chunk):
        return False  # (one library registers both calls)
    if k_pages.dtype not in PAGE_DTYPES or v_pages.dtype != k_pages.dtype or v_pages.shape[2] % 8:
        return False
    return kernels.unsplit()


def decode(q, k_pages, v_pages, tables, q_pos, spec: AttentionSpec, sinks=None):
    """q (R, 1, H, dk); k_pages (P, KVH, dk, ps); v_pages (P, KVH, ps, dv); tables (R, W); q_pos (R, 1)
    -> (R, 1, H, dv) in q's dtype, as paged_attention computes it."""
    r, _, h, _ = q.shape
    dv = quant.logical_dim(v_pages.shape[3], v_pages.dtype)
    call = jax.ffi.ffi_call(kernels.ATTENTION_TARGET, jax.ShapeDtypeStruct((r, h, dv), jnp.float32),
                            vmap_method="sequential")
    out = call(q[:, 0].astype(jnp.float32), k_pages, v_pages, tables.astype(jnp.int32),
               q_pos[:, 0].astype(jnp.int32),
               jnp.zeros((h,), jnp.float32) if sinks is None else sinks.astype(jnp.float32),
               scale=np.float32(spec.scale), softcap=np.float32(spec.softcap or 0.0),
               window=np.int64(spec.window or 0), has_sinks=np.int64(sinks is not None))
    return out[:, None].astype(q.dtype)
