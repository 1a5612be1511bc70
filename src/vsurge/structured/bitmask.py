"""Packed token bitmasks: one int32 word per 32 tokens, bit j of word w = token 32*w + j.

The host fills a (B, ceil(V/32)) int32 array (one row per batch row: all ones for
unconstrained rows); the compiled step applies it to its (B, V) logits with
`apply_token_bitmask`. The array's shape depends only on B and V, so constrained
and free rows share one batch and nothing recompiles.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

ALL_ALLOWED = -1  # int32 with every bit set


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_bitmask(batch: int, vocab_size: int) -> np.ndarray:
    """(batch, ceil(V/32)) int32, every token allowed (what unconstrained rows keep)."""
    return np.full((batch, bitmask_words(vocab_size)), ALL_ALLOWED, np.int32)


def allow_all(bitmask: np.ndarray, rows=None) -> None:
    """Reset `rows` (all when None) to every token allowed."""
    if rows is None:
        bitmask[...] = ALL_ALLOWED
    else:
        bitmask[rows] = ALL_ALLOWED


def set_tokens(row: np.ndarray, tokens, allowed: bool) -> None:
    """Set or clear the bits of `tokens` in one row (ceil(V/32),) int32, in place."""
    words = row.view(np.uint32)
    for t in tokens:
        bit = np.uint32(1 << (int(t) % 32))
        if allowed:
            words[int(t) // 32] |= bit
        else:
            words[int(t) // 32] &= ~bit


def token_allowed(row: np.ndarray, token: int) -> bool:
    return bool((int(row[token // 32]) >> (token % 32)) & 1)


def unpack_bitmask(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """(B, W) int32 -> (B, V) bool; the numpy reference of what the step applies."""
    bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :vocab_size].astype(bool)


def allowed_tokens(row: np.ndarray, vocab_size: int) -> np.ndarray:
    """Token ids allowed by one row (W,) int32 -> (n,) int64."""
    return np.flatnonzero(unpack_bitmask(row[None], vocab_size)[0])


def apply_token_bitmask(logits: jnp.ndarray, bitmask: jnp.ndarray) -> jnp.ndarray:
    """Disallowed tokens -> -inf. Pure jax.numpy, for use inside the compiled step.

    logits (B, V) float; bitmask (B, ceil(V/32)) int32. Bits past V (the last word's
    padding) are ignored. Apply before penalties, temperature and top-k/p so every
    filter and the greedy argmax only see allowed tokens (-inf stays -inf through them)."""
    batch, vocab = logits.shape
    shifts = jnp.arange(32, dtype=jnp.int32)  # (32,)
    bits = (bitmask[:, :, None] >> shifts) & 1  # (B, W, 32); arithmetic shift, then one bit
    allowed = bits.reshape(batch, -1)[:, :vocab] != 0  # (B, V)
    return jnp.where(allowed, logits, jnp.asarray(-jnp.inf, logits.dtype))
