"""Matrix multiply with float weights, weights kept in GGUF blocks, or int8 weights with
per-output-channel scales.

Weights in blocks (ops/quantized.py: a GGUF file's tensors kept as they are, or float weights
quantized at load) are (N, K) whichever way the float weight they replace is laid out, so
`linear` (x @ w for w (K, N)) and `matmul_t` (x @ w.T for w (N, K), a tied head) are the same
call there: qmatmul, the C++ kernel on CPU.

Float weights in a narrower dtype than the activations (bfloat16 weights,
float32 activations) multiply in the weights' dtype and accumulate in
float32: XLA:CPU runs bf16 x bf16 -> f32 dots at twice the float32 rate on
CPUs with AVX512-BF16, and accelerators do the same natively. A one-row
bfloat16 dot takes a slow path on XLA:CPU (~7x slower than two rows), so
single rows are computed as two.

fp8 weights (float8_e4m3fn with per-output-channel scales) are for accelerators with fp8 support
(weight bytes halved against bfloat16: a memory-bound decode reads half): they are converted to the
activations' dtype inside the jitted dot, where XLA fuses the conversion into the matmul; on CPU
that conversion runs every call, so the block formats (int4 / q8_0) are the CPU's quantizations.

int8 weights on an accelerator (TPU, GPU) take the fp8 path: converted to the activations' dtype inside
the dot's fusion, so a memory-bound decode reads one byte a weight (an 8B model fits one 16 GB TPU v5e).
On XLA:CPU the int8 path is different: a float32 dot is bandwidth-bound at
batch 1 and an int8 x int8 -> int32 dot is several times cheaper per weight.
Activations are quantized per row in two passes (the value, then its
rounding error), stacked as extra rows of one dot, so they keep ~15 bits
while the weights are read once. Large inputs (prefill) dequantize the
weights instead: there the dot is compute-bound and float is faster.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .quantized import is_quantized, qmatmul

INT8_ROWS_LIMIT = 64  # above this many rows, dequantize and use a float dot


def quantize_int8(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """w (..., K, N) float -> (int8 (..., K, N), scale (..., N) float32), symmetric per output channel."""
    w32 = w.astype(jnp.float32)
    scale = jnp.max(jnp.abs(w32), axis=-2) / 127.0
    scale = jnp.where(scale > 0, scale, 1.0)
    return jnp.round(w32 / scale[..., None, :]).astype(jnp.int8), scale


FP8 = jnp.dtype(jnp.float8_e4m3fn)
FP8_MAX = 448.0  # e4m3fn's largest finite value


def quantize_fp8(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """w (..., K, N) float -> (float8_e4m3fn (..., K, N), scale (..., N) float32): each output channel
    scaled so its largest magnitude is e4m3's largest, 448."""
    w32 = w.astype(jnp.float32)
    scale = jnp.max(jnp.abs(w32), axis=-2) / FP8_MAX
    scale = jnp.where(scale > 0, scale, 1.0)
    return (w32 / scale[..., None, :]).astype(FP8), scale


def _quantize_rows(x):
    """x (M, K) -> integer-valued float (M, K), per-row scale (M, 1)."""
    scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 127.0
    scale = jnp.where(scale > 0, scale, 1.0)
    return jnp.round(x / scale), scale


def settled(x: jax.Array) -> jax.Array:
    """x as computed, fenced from what follows on an accelerator: XLA's layout assignment on a TPU moved the
    reshape that splits a fused matmul's output (interleaved gate/up pairs, qkv groups) into the matmul's
    weight, and so re-laid the whole weight every step (1B shape: ~6 ms of a 13 ms decode step). Behind the
    barrier the reshape stays on the small activation. Unchanged on a CPU."""
    return x if jax.default_backend() == "cpu" else jax.lax.optimization_barrier(x)


def mixed_dot(x: jax.Array, w: jax.Array, w_contract: int) -> jax.Array:
    """x (..., K) . w over w's axis `w_contract` -> (..., N) in x.dtype, accumulated in float32."""
    if w.dtype == x.dtype:
        return jax.lax.dot_general(x, w, (((x.ndim - 1,), (w_contract,)), ((), ())))
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k)
    single = rows.shape[0] == 1
    if single:
        rows = jnp.concatenate([rows, rows])
    out = jax.lax.dot_general(rows.astype(w.dtype), w, (((1,), (w_contract,)), ((), ())),
                              preferred_element_type=jnp.float32)
    return out[:1].reshape(*lead, -1).astype(x.dtype) if single else out.reshape(*lead, -1).astype(x.dtype)


def matmul_t(x: jax.Array, w: jax.Array) -> jax.Array:
    """x (..., K) @ w.T for w (N, K) (a tied output head) -> (..., N)."""
    if is_quantized(w):
        return qmatmul(x, w).astype(x.dtype)
    return mixed_dot(x, w, 1)


def converted_dot(x: jax.Array, w: jax.Array, scale: jax.Array) -> jax.Array:
    """x (..., K) @ (w (K, N) int8 or fp8 * scale (N,)) -> (..., N) in x.dtype: w converted to x's dtype inside
    the dot's fusion (an accelerator reads one byte a weight), the scale applied per output channel after it."""
    return (mixed_dot(x, w.astype(x.dtype), 0) * scale.astype(x.dtype)).astype(x.dtype)


def linear(x: jax.Array, w: jax.Array, scale: jax.Array | None = None) -> jax.Array:
    """x (..., K) @ w (K, N) -> (..., N); w int8 or float8_e4m3fn with `scale` (N,) selects the int8
    or fp8 path, w in blocks (a QuantizedWeight of logical shape (N, K)) the block kernel."""
    if is_quantized(w):
        return qmatmul(x, w).astype(x.dtype)
    if scale is None:
        return mixed_dot(x, w, 0)
    if w.dtype == FP8 or jax.default_backend() != "cpu":
        return converted_dot(x, w, scale)
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k).astype(jnp.float32)
    m = rows.shape[0]
    if m > INT8_ROWS_LIMIT:
        out = rows @ (w.astype(jnp.float32) * scale[None, :])
    else:
        hi, s_hi = _quantize_rows(rows)
        lo, s_lo = _quantize_rows(rows - hi * s_hi)
        both = jnp.concatenate([hi, lo]).astype(jnp.int8)  # (2M, K): one pass over the weights
        acc = jax.lax.dot_general(both, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
        acc = acc.astype(jnp.float32)
        out = (acc[:m] * s_hi + acc[m:] * s_lo) * scale[None, :]
    return out.reshape(*lead, w.shape[-1]).astype(x.dtype)
