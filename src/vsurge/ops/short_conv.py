"""Causal depthwise 1-D convolution with a carried window (short convolution).

Qwen3-Next / Qwen3.5 run it over the q/k/v projections before Gated DeltaNet, Mamba-2 before its
SSM, LFM2 as its whole token mixer. Each channel c sees its own K taps:
    y[t, c] = sum_j weight[c, j] * xx[t + j, c] (+ bias[c]),   xx = concat(window, x)
where `window` holds the K-1 inputs before x (zeros for a fresh sequence), so a prompt may arrive
in pieces and decode continues it one token at a time. No activation: callers apply silu.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _taps(xx: jax.Array, weight: jax.Array, bias, T: int) -> jax.Array:
    """xx (B, T+K-1, C) float32, weight (C, K) -> (B, T, C) float32: the K shifted, weighted copies."""
    K = weight.shape[1]
    w = weight.astype(jnp.float32)
    y = sum(xx[:, j:j + T, :] * w[:, j] for j in range(K))  # K is tiny (typically 3-4): unrolled
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y


def causal_conv(x, weight, bias, window, valid=None):
    """x (B, T, C); weight (C, K); bias (C,) or None; window (B, K-1, C); valid (B, T) bool, True on a
    prefix of each row, or None (all valid).

    Returns y (B, T, C) in x.dtype (garbage on invalid tokens) and new_window (B, K-1, C) in
    window.dtype: the last K-1 inputs of concat(window, the row's valid tokens); a row with no
    valid token keeps its window."""
    B, T, C = x.shape
    K = weight.shape[1]
    xx = jnp.concatenate([window.astype(jnp.float32), x.astype(jnp.float32)], axis=1)  # (B, T+K-1, C)
    y = _taps(xx, weight, bias, T)
    if valid is None:
        new_window = xx[:, T:]  # (B, K-1, C)
    else:
        n = jnp.sum(valid, axis=1, dtype=jnp.int32)  # (B,) valid tokens per row
        # the window ends at each row's own last valid token, so a per-row start: xx[n : n+K-1]
        take = lambda row, start: jax.lax.dynamic_slice_in_dim(row, start, K - 1, axis=0)  # noqa: E731
        new_window = jax.vmap(take)(xx, n)  # (B, K-1, C)
    return y.astype(x.dtype), new_window.astype(window.dtype)


def causal_conv_step(x, weight, bias, window, valid=None):
    """One token per row (decode): x (B, C), window (B, K-1, C), valid (B,) bool or None.

    Returns y (B, C) in x.dtype and new_window (B, K-1, C); a row with valid False keeps its window."""
    xx = jnp.concatenate([window.astype(jnp.float32), x.astype(jnp.float32)[:, None]], axis=1)  # (B, K, C)
    y = _taps(xx, weight, bias, 1)[:, 0]  # (B, C)
    new_window = xx[:, 1:].astype(window.dtype)  # (B, K-1, C) shift in the new token
    if valid is not None:
        new_window = jnp.where(valid[:, None, None], new_window, window)
    return y.astype(x.dtype), new_window


def causal_conv_in_place(inputs, windows, slots, fresh, valid, *, weight, bias=None):
    """`causal_conv_step` on decode rows whose windows live in the paged engine's `windows` (S+1, K-1, C)
    (float32 or bfloat16) at `slots` (R,), by the C++ kernel (kernels/recurrent_decode.cc): inputs (x,)
    with x (R, C); fresh (R,) bool: start from a zero window; valid (R,) bool: shift x in. Returns
    (y (R, C) in x.dtype, windows), or None where the kernel cannot run (kv/recurrent.py by_length)."""
    from .. import kernels

    if not kernels.in_place_usable(windows):
        return None
    (x,) = inputs
    c = x.shape[-1]
    taps = weight.astype(jnp.float32).T  # (K, C)
    bias = jnp.zeros((c,), jnp.float32) if bias is None else bias.astype(jnp.float32)
    call = jax.ffi.ffi_call(kernels.CONV_TARGET, (jax.ShapeDtypeStruct(x.shape, jnp.float32),
                                                  jax.ShapeDtypeStruct(windows.shape, windows.dtype)),
                            input_output_aliases={0: 1}, vmap_method="sequential")
    y, windows = call(windows, x.astype(jnp.float32), taps, bias, slots.astype(jnp.int32), fresh.astype(jnp.int32),
                      valid.astype(jnp.int32))
    return y.astype(x.dtype), windows

