"""K and V vectors written into their cache slots, and pages read back (the paged pool, the dense cache).

`write_tokens` stores each token's vector as the cache holds it (kv/quant.py: cast, or quantized
with its scale) at (page, offset): keys (P, H, dk, ps) along their last axis, values
(P, H, ps, dv) along the third. `read_pages` gathers whole pages, expanded to a float dtype;
`take_pages` / `put_pages` copy whole pages out and in as stored (tiers, transfers).

On CPU a 16-bit float cache (bfloat16, float16) is written and read by C++ calls
(kernels/kv_pages.cc): XLA:CPU has neither a 16-bit float scatter nor gather, and converted the
whole pool to float32 around every layer's write (1.7 s of a 32-row default-model decode step
with a bfloat16 pool) and for the page gathers of prompt rows (hoisted out of their loop); a
bitcast to uint16 around them copied the pool instead. Everywhere else (float32, int8 and fp8
caches; GPU and TPU; a pool sharded over a mesh) these are XLA's scatter and gather.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import kernels
from . import quant

KEY_AXIS, VALUE_AXIS = 3, 2  # the token axis of key (P, H, dk, ps) and value (P, H, ps, dv) arrays


def write_tokens(cache, page, offset, x, token_axis: int):
    """cache (P, H, ., .); page, offset (T,) int; x (T, H, d) float -> the cache with token t's vector
    at [page[t], :, :, offset[t]] (keys) or [page[t], :, offset[t]] (values); tokens whose page or
    offset is out of range are dropped (padding rows)."""
    stored = quant.store(x, cache.dtype)
    if _in_cpp(cache):
        call = jax.ffi.ffi_call(kernels.KV_WRITE_TARGET, jax.ShapeDtypeStruct(cache.shape, cache.dtype),
                                input_output_aliases={0: 0}, vmap_method="sequential")
        return call(cache, page.astype(jnp.int32), offset.astype(jnp.int32), stored, token_axis=np.int64(token_axis))
    index = (page, slice(None), slice(None), offset) if token_axis == KEY_AXIS else (page, slice(None), offset)
    return cache.at[index].set(stored, mode="drop")


def read_pages(k_cache, v_cache, ids, dtype):
    """Pages `ids` (R,) of the key (P, KVH, dk', ps) and value (P, KVH, ps, dv') caches ->
    (R, KVH, dk, ps), (R, KVH, ps, dv) in `dtype` (dequantized, kv/quant.expand)."""
    if _in_cpp(k_cache) and _in_cpp(v_cache):
        ids = ids.astype(jnp.int32)
        gather = lambda c: jax.ffi.ffi_call(kernels.GATHER_PAGES_TARGET,  # noqa: E731
                                            jax.ShapeDtypeStruct((ids.shape[0], *c.shape[1:]), jnp.float32),
                                            vmap_method="sequential")(c, ids)
        return gather(k_cache).astype(dtype), gather(v_cache).astype(dtype)
    return quant.expand(k_cache[ids], v_cache[ids], dtype)


def take_pages(cache, ids):
    """Whole pages `ids` (R,) of a cache (P, ...) -> (R, ...), as stored (the tiers' and transfers' copies)."""
    if _in_cpp(cache):
        call = jax.ffi.ffi_call(kernels.TAKE_PAGES_TARGET, jax.ShapeDtypeStruct((ids.shape[0], *cache.shape[1:]),
                                                                                cache.dtype), vmap_method="sequential")
        return call(cache, ids.astype(jnp.int32))
    return cache[ids]


def put_pages(cache, ids, pages):
    """The cache (P, ...) with pages (R, ...) written at `ids` (R,); ids out of range are dropped."""
    pages = pages.astype(cache.dtype)
    if _in_cpp(cache):
        call = jax.ffi.ffi_call(kernels.PUT_PAGES_TARGET, jax.ShapeDtypeStruct(cache.shape, cache.dtype),
                                input_output_aliases={0: 0}, vmap_method="sequential")
        return call(cache, ids.astype(jnp.int32), pages)
    return cache.at[ids].set(pages, mode="drop")


def _in_cpp(cache) -> bool:
    """A 16-bit float cache the C++ page writers update in place (kernels.call_serves)."""
    return kernels.call_serves(cache.dtype, (jnp.bfloat16, jnp.float16))
