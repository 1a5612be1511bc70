"""KV storage dtypes (`--kv-cache-dtype`): 16-bit floats as they are, int8 / fp8 with symmetric absmax
scaling per token and KV head.

bfloat16 / float16 pages are the values cast (a float32 model's cache in half the bytes, as
llama.cpp's default f16 cache; read back as the compute dtype per gathered page).

Each token's key (or value) vector of one head, over head_dim, is stored as `q = x / s` in the
storage dtype with one float16 scale `s = absmax / qmax` (int8: rounded, qmax 127; fp8 =
float8_e4m3fn: qmax 448, its largest finite value), and read back as `q * s`. The scale is packed
into the same array, as its 2 bytes (bitcast) appended to the head_dim axis:

    keys    (P, KVH, dk + 2, ps)   rows [:dk] the values, rows [dk:] the scale of each token
    values  (P, KVH, ps, dv + 2)   columns [:dv] the values, columns [dv:] the scale

so a page is one array per layer side, exactly as in the float pool: everything that gathers,
copies, ships or stores pages (engine/transfer.py, engine/tier_mover.py, kv/disk_tier.py, the
remote decode engine, sharding over KV heads) carries the scales with the values and cannot
lose them. Why float16 for the scale: 2 bytes (bfloat16 costs the same), and its 11-bit mantissa
rounds the scale by <= 0.05%, far under the int8 step (1/254 of absmax); bfloat16's 8 bits
would add an error as large as the step itself. Its range covers absmax up to 65504 * qmax.
Quantizing divides by the rounded scale and clips, so every stored value is within [-qmax, qmax].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import KV_CACHE_DTYPES

STORAGE = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16, "int8": jnp.int8,
           "fp8": jnp.float8_e4m3fn}
QMAX = {jnp.dtype(jnp.int8): 127.0, jnp.dtype(jnp.float8_e4m3fn): 448.0}
SCALE_DTYPE = jnp.float16
SCALE_BYTES = 2  # the float16 scale's bytes (one byte per element of the 1-byte storage dtypes)


def storage_dtype(kv_cache_dtype: str | None, model_dtype) -> jnp.dtype:
    """The dtype the KV pages are stored in: the model's (None / "auto"), a float dtype, int8 or float8_e4m3fn."""
    if kv_cache_dtype in (None, "auto"):
        return jnp.dtype(model_dtype)
    if kv_cache_dtype in STORAGE:
        return jnp.dtype(STORAGE[kv_cache_dtype])
    raise ValueError(f"kv_cache_dtype (--kv-cache-dtype) must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")


def is_quantized(dtype) -> bool:
    return jnp.dtype(dtype) in QMAX


def stored_dim(head_dim: int, dtype) -> int:
    """head_dim of the stored array: the scale's bytes are appended when quantized."""
    return head_dim + SCALE_BYTES if is_quantized(dtype) else head_dim


def logical_dim(stored: int, dtype) -> int:
    """head_dim of the vectors a stored array of `dtype` holds (stored_dim's inverse)."""
    return stored - SCALE_BYTES if is_quantized(dtype) else stored


def token_bytes(head_dim: int, dtype) -> int:
    """Bytes one token of one head takes for one of keys or values."""
    return stored_dim(head_dim, dtype) * jnp.dtype(dtype).itemsize


def quantize(x, dtype):
    """x (..., d) float -> (..., d + 2) `dtype` (int8 or float8_e4m3fn): the values over the last
    axis scaled into [-qmax, qmax], then the float16 scale's 2 bytes."""
    dtype = jnp.dtype(dtype)
    qmax = QMAX[dtype]
    x = x.astype(jnp.float32)
    scale = (jnp.max(jnp.abs(x), axis=-1, keepdims=True) / qmax).astype(SCALE_DTYPE)  # (..., 1)
    safe = jnp.where(scale > 0, scale.astype(jnp.float32), 1.0)  # an all-zero vector stores zeros
    q = jnp.clip(x / safe, -qmax, qmax)
    q = jnp.round(q) if dtype == jnp.int8 else q
    return jnp.concatenate([q.astype(dtype), jax.lax.bitcast_convert_type(scale[..., 0], dtype)], axis=-1)


def store(x, dtype):
    """K or V vectors x (..., d) as a cache of `dtype` holds them: quantized with their scales (..., d + 2)
    for int8 / fp8, else cast."""
    return quantize(x, dtype) if is_quantized(dtype) else x.astype(dtype)


def dequantize(packed, dtype):
    """(..., d + 2) from `quantize` -> (..., d) `dtype`."""
    scale = jax.lax.bitcast_convert_type(packed[..., -SCALE_BYTES:], SCALE_DTYPE)  # (...,)
    return (packed[..., :-SCALE_BYTES].astype(jnp.float32) * scale[..., None].astype(jnp.float32)).astype(dtype)


def dequantize_key_pages(pages, dtype):
    """Gathered key pages (R, KVH, dk + 2, ps) -> (R, KVH, dk, ps) `dtype` (only the scale rows are
    transposed for their bitcast, not the page)."""
    scale = jax.lax.bitcast_convert_type(pages[..., -SCALE_BYTES:, :].swapaxes(-1, -2), SCALE_DTYPE)  # (R, KVH, ps)
    values = pages[..., :-SCALE_BYTES, :].astype(jnp.float32)
    return (values * scale[..., None, :].astype(jnp.float32)).astype(dtype)


def expand(keys, values, dtype):
    """Stored keys (..., KVH, dk', T) and values (..., KVH, T, dv') -> `dtype`, dequantized when stored
    as int8 / fp8 (dk' = dk + 2), else cast (a no-op when stored in `dtype`)."""
    if not is_quantized(values.dtype):
        return keys.astype(dtype), values.astype(dtype)
    return dequantize_key_pages(keys, dtype), dequantize(values, dtype)
