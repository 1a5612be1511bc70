"""Rotary position embeddings in the HF "rotate half" layout.

GGUF files of arch `llama` store Q/K rows permuted for llama.cpp's interleaved
layout; the GGUF loader undoes that, so one rotation serves every source.
"""

from __future__ import annotations

import math
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from ..config import ModelConfig


@lru_cache(maxsize=32)
def inverse_frequencies(config: ModelConfig) -> np.ndarray:
    """(head_dim // 2,) inverse frequencies after any scaling."""
    dim = config.head_dim
    # float32 like the HF reference, so positions * inv_freq round the same way.
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    inv_freq = (1.0 / (np.float32(config.rope_theta) ** exponents)).astype(np.float64)
    scaling = config.rope_scaling
    if scaling.kind == "linear":
        inv_freq = inv_freq / scaling.factor
    elif scaling.kind == "llama3":
        inv_freq = _llama3_scaled(inv_freq, scaling)
    elif scaling.kind != "default":
        raise ValueError(f"unsupported rope scaling type {scaling.kind!r}")
    if config.rope_freq_factors is not None:
        inv_freq = inv_freq / np.asarray(config.rope_freq_factors, dtype=np.float64)
    return inv_freq.astype(np.float32)


def _llama3_scaled(inv_freq: np.ndarray, s) -> np.ndarray:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between
    # interpolated smoothly (Llama 3.1 paper, section 3).
    old_len = s.original_max_position_embeddings
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled)


def rope_cos_sin(positions: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
    """positions: (B, T) int -> cos, sin: (B, T, head_dim // 2) float32."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq[None, None, :]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x: (B, T, H, head_dim); cos/sin: (B, T, head_dim // 2) -> same shape as x."""
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    rotated = jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    return rotated.astype(x.dtype)
