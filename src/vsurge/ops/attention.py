"""Scaled dot-product attention with grouped-query heads and a position mask.

Keys are stored transposed, `(B, KVH, hd, S)`: the query-key dot then streams
each head's keys along S, which XLA:CPU runs about twice as fast as the
`(B, KVH, S, hd)` form. Every cache layout (none, dense, paged) gathers keys
and values with their positions and calls these functions; `partial_attend` +
`merge_partials` compute attention over key segments one at a time (online
softmax), so a paged cache never concatenates its pages.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_MASKED = jnp.finfo(jnp.float32).min  # finite: a fully masked segment still has a finite max


def _visible(q_pos, k_pos, sliding_window):
    """q_pos (B, T), k_pos (B, S) -> (B, T, S) bool: causal, written (k_pos >= 0), in the window."""
    visible = (k_pos[:, None, :] <= q_pos[:, :, None]) & (k_pos[:, None, :] >= 0)
    if sliding_window is not None:
        visible &= k_pos[:, None, :] > q_pos[:, :, None] - sliding_window
    return visible


def _scores(q, k_t):
    """q (B, T, H, hd), k_t (B, KVH, hd, S) -> (B, KVH, G, T, S) float32, scaled."""
    b, t, h, hd = q.shape
    kvh = k_t.shape[1]
    qg = q.reshape(b, t, kvh, h // kvh, hd).astype(k_t.dtype)
    if t == 1:  # decode: plain batched mat-vecs, no transposes
        s = jnp.einsum("bkgd,bkds->bkgs", qg[:, 0], k_t, preferred_element_type=jnp.float32)[:, :, :, None]
    else:
        s = jnp.einsum("btkgd,bkds->bkgts", qg, k_t, preferred_element_type=jnp.float32)
    return s * (1.0 / (hd**0.5))


def _weighted_values(p, v):
    """p (B, KVH, G, T, S), v (B, KVH, S, hd) -> (B, T, KVH, G, hd) float32."""
    p = p.astype(v.dtype)
    if p.shape[3] == 1:
        return jnp.einsum("bkgs,bksd->bkgd", p[:, :, :, 0], v, preferred_element_type=jnp.float32)[:, None]
    return jnp.einsum("bkgts,bksd->btkgd", p, v, preferred_element_type=jnp.float32)


def attend(
    q: jax.Array,  # (B, T, H, hd)
    k_t: jax.Array,  # (B, KVH, hd, S)
    v: jax.Array,  # (B, KVH, S, hd)
    q_pos: jax.Array,  # (B, T) int32 absolute positions of the queries
    k_pos: jax.Array,  # (B, S) int32 absolute positions of the keys; < 0 = empty
    sliding_window: int | None = None,
) -> jax.Array:  # (B, T, H, hd)
    scores = _scores(q, k_t)
    scores = jnp.where(_visible(q_pos, k_pos, sliding_window)[:, None, None], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1)
    return _weighted_values(probs, v).reshape(q.shape).astype(q.dtype)


def partial_attend(q, k_t, v, q_pos, k_pos, sliding_window=None):
    """Attention of q over one key segment, unnormalized: (out (B, T, KVH, G, hd), max, sum),
    max and sum (B, KVH, G, T, 1). Combine segments with `merge_partials`."""
    scores = _scores(q, k_t)
    scores = jnp.where(_visible(q_pos, k_pos, sliding_window)[:, None, None], scores, _MASKED)
    m = jnp.max(scores, axis=-1, keepdims=True)
    p = jnp.exp(scores - m)
    return _weighted_values(p, v), m, jnp.sum(p, axis=-1, keepdims=True)


def merge_partials(parts, out_shape, dtype) -> jax.Array:
    """Online-softmax merge of `partial_attend` results -> (B, T, H, hd) in `dtype`."""
    if len(parts) == 1:
        out, m, total = parts[0]
        return (out / _to_out(total)).reshape(out_shape).astype(dtype)
    m = parts[0][1]
    for _, mi, _ in parts[1:]:
        m = jnp.maximum(m, mi)
    num = sum(o * _to_out(jnp.exp(mi - m)) for o, mi, _ in parts)
    den = sum(_to_out(jnp.exp(mi - m) * li) for _, mi, li in parts)
    return (num / den).reshape(out_shape).astype(dtype)


def merge_into(acc, part):
    """Fold one `partial_attend` result into a running one (same shapes): the loop form of
    merge_partials."""
    (o1, m1, l1), (o2, m2, l2) = acc, part
    m = jnp.maximum(m1, m2)
    a, b = jnp.exp(m1 - m), jnp.exp(m2 - m)
    return o1 * _to_out(a) + o2 * _to_out(b), m, l1 * a + l2 * b


def _to_out(x):
    """(B, KVH, G, T, 1) -> (B, T, KVH, G, 1), the layout of partial outputs."""
    return jnp.moveaxis(x, 3, 1)
