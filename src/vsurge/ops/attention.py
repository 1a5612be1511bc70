"""Scaled dot-product attention with grouped-query heads and a position mask.

Every cache layout (none, dense, paged) gathers its keys/values and their
positions, then calls `attend`; a fused kernel can later replace this one
function without touching the model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_MASKED = jnp.finfo(jnp.float32).min


def attend(
    q: jax.Array,  # (B, T, H, hd)
    k: jax.Array,  # (B, KVH, S, hd)
    v: jax.Array,  # (B, KVH, S, hd)
    q_pos: jax.Array,  # (B, T) int32 absolute positions of the queries
    k_pos: jax.Array,  # (B, S) int32 absolute positions of the keys; < 0 = empty
    sliding_window: int | None = None,
) -> jax.Array:  # (B, T, H, hd)
    b, t, h, hd = q.shape
    kvh = k.shape[1]
    groups = h // kvh
    if t == 1:
        return _attend_one(q, k, v, q_pos, k_pos, sliding_window)
    qg = q.reshape(b, t, kvh, groups, hd)
    scores = jnp.einsum("btkgd,bksd->bkgts", qg, k, preferred_element_type=jnp.float32)
    scores = scores * (1.0 / (hd**0.5))
    visible = (k_pos[:, None, :] <= q_pos[:, :, None]) & (k_pos[:, None, :] >= 0)  # (B, T, S)
    if sliding_window is not None:
        visible &= k_pos[:, None, :] > q_pos[:, :, None] - sliding_window
    scores = jnp.where(visible[:, None, None, :, :], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bksd->btkgd", probs, v, preferred_element_type=jnp.float32)
    return out.reshape(b, t, h, hd).astype(q.dtype)


def _attend_one(q, k, v, q_pos, k_pos, sliding_window):
    """Decode: one query per row. Dropping the T axis lets XLA:CPU use plain batched
    mat-vecs with no transposes (about 3x faster than the general form at batch 8)."""
    b, _, h, hd = q.shape
    kvh = k.shape[1]
    qg = q.reshape(b, kvh, h // kvh, hd)
    scores = jnp.einsum("bkgd,bksd->bkgs", qg, k, preferred_element_type=jnp.float32) * (1.0 / (hd**0.5))
    visible = (k_pos <= q_pos) & (k_pos >= 0)  # (B, S): q_pos (B, 1) broadcasts
    if sliding_window is not None:
        visible &= k_pos > q_pos - sliding_window
    scores = jnp.where(visible[:, None, None, :], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgs,bksd->bkgd", probs, v, preferred_element_type=jnp.float32)
    return out.reshape(b, 1, h, hd).astype(q.dtype)
