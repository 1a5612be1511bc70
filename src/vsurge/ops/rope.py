"""Rotary position embeddings in the HF "rotate half" layout, with every scaling family uses.

A layer's `Rope` (config.py) gives its inverse frequencies and the factor its
cos/sin are scaled by (yarn, longrope); partial rotary rotates only the first
`rope.dim` dims of each head. Checkpoints whose rows are in another rotary
layout (llama.cpp's interleaved pairs, DeepSeek's interleaved rope dims) are
permuted at load time (models/parts/spec.py), so one rotation serves every source.
"""

from __future__ import annotations

import math
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from ..config import Rope


@lru_cache(maxsize=64)
def rope_frequencies(rope: Rope, head_dim: int) -> tuple[np.ndarray, float]:
    """(inverse frequencies (rotary_dim // 2,) float32, cos/sin scaling factor)."""
    dim = rope.dim or head_dim
    # float32 like the HF reference, so positions * inv_freq round the same way.
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    base = np.float32(rope.theta) ** exponents  # (dim/2,)
    inv_freq = (1.0 / base).astype(np.float64)
    scaling = 1.0
    if rope.kind == "linear":
        inv_freq = inv_freq / rope.factor
    elif rope.kind == "llama3":
        inv_freq = _llama3_scaled(inv_freq, rope)
    elif rope.kind == "yarn":
        inv_freq, scaling = _yarn(base, dim, rope)
    elif rope.kind == "longrope":
        factors = rope.long_factor if rope.use_long_factor else rope.short_factor
        inv_freq = (1.0 / (np.asarray(factors, np.float32) * base)).astype(np.float64)
        scaling = _longrope_scaling(rope)
    elif rope.kind != "default":
        raise ValueError(f"unsupported rope scaling type {rope.kind!r}")
    if rope.freq_factors is not None:
        inv_freq = inv_freq / np.asarray(rope.freq_factors, dtype=np.float64)
    return inv_freq.astype(np.float32), float(scaling)


def _llama3_scaled(inv_freq: np.ndarray, s: Rope) -> np.ndarray:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between
    # interpolated smoothly (Llama 3.1 paper, section 3).
    old_len = s.original_max_position_embeddings or 8192
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(base: np.ndarray, dim: int, s: Rope) -> tuple[np.ndarray, float]:
    """YaRN: frequencies that rotate less than beta_slow times over the original context are
    interpolated by `factor`, those over beta_fast kept, a linear ramp between."""
    original = s.original_max_position_embeddings

    def correction_dim(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(s.theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolate = 1 - ramp  # 1: keep the original frequency
    inv_extra, inv_inter = 1.0 / base, 1.0 / (s.factor * base)
    inv_freq = inv_inter * (1 - extrapolate) + inv_extra * extrapolate
    if s.attention_factor is not None:
        scaling = s.attention_factor
    elif s.mscale and s.mscale_all_dim:
        scaling = _yarn_mscale(s.factor, s.mscale) / _yarn_mscale(s.factor, s.mscale_all_dim)
    else:
        scaling = _yarn_mscale(s.factor)
    return inv_freq.astype(np.float64), scaling


def _longrope_scaling(s: Rope) -> float:
    if s.attention_factor is not None:
        return s.attention_factor
    if s.factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(s.factor) / math.log(s.original_max_position_embeddings))


def yarn_softmax_scale(rope: Rope) -> float:
    """The extra factor DeepSeek's attention multiplies its softmax scale by under YaRN
    (mscale_all_dim squared); 1 otherwise."""
    if rope.kind != "yarn" or not rope.mscale_all_dim:
        return 1.0
    return _yarn_mscale(rope.factor, rope.mscale_all_dim) ** 2


def rope_cos_sin(positions: jax.Array, rope: Rope, head_dim: int) -> tuple[jax.Array, jax.Array]:
    """positions: (B, T) int -> cos, sin: (B, T, rotary_dim // 2) float32 (scaled)."""
    inv_freq, scaling = rope_frequencies(rope, head_dim)
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]
    if scaling == 1.0:
        return jnp.cos(angles), jnp.sin(angles)
    return jnp.cos(angles) * scaling, jnp.sin(angles) * scaling


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x: (B, T, H, hd); cos/sin: (B, T, r/2) -> same shape as x, the first r dims rotated."""
    rotary = 2 * cos.shape[-1]
    x32 = x.astype(jnp.float32)
    rot, rest = x32[..., :rotary], x32[..., rotary:]
    half = rotary // 2
    x1, x2 = rot[..., :half], rot[..., half:]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    parts = [x1 * c - x2 * s, x2 * c + x1 * s]
    if rest.shape[-1]:
        parts.append(rest)
    return jnp.concatenate(parts, axis=-1).astype(x.dtype)
