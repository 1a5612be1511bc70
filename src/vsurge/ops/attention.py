"""Scaled dot-product attention with grouped-query heads and a position mask.

Keys are stored transposed, `(B, KVH, dk, S)`: the query-key dot then streams
each head's keys along S, which XLA:CPU runs about twice as fast as the
`(B, KVH, S, dk)` form. Every cache layout (none, dense, paged) gathers keys
and values with their positions and calls these functions; `partial_attend` +
`merge_partials` compute attention over key segments one at a time (online
softmax), so a paged cache never concatenates its pages.

A layer's `AttentionSpec` (config.py) sets the score scale, its sliding window
or local chunks, and tanh soft-capping; `sinks` (H,) are learned logits that join every row's
softmax without a value (GPT-OSS). Values may be narrower than keys (a latent
cache: keys carry the rotary part too), so outputs are (..., H, dv).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..config import AttentionSpec

_MASKED = jnp.finfo(jnp.float32).min  # finite: a fully masked segment still has a finite max


def _visible(q_pos, k_pos, window=None, chunk=None, q_limit=None):
    """q_pos (B, T), k_pos (B, S) -> (B, T, S) bool: causal, written (k_pos >= 0), in the window,
    in the query's chunk. q_limit (B, T): the last key position each query sees where that is not its
    own (an image's tokens see the whole image: Gemma 3); the window stays relative to q_pos."""
    limit = q_pos if q_limit is None else q_limit
    visible = (k_pos[:, None, :] <= limit[:, :, None]) & (k_pos[:, None, :] >= 0)
    if window is not None:
        visible &= k_pos[:, None, :] > q_pos[:, :, None] - window
    if chunk is not None:
        visible &= k_pos[:, None, :] // chunk == q_pos[:, :, None] // chunk
    return visible


def group_queries(q, kvh: int):
    """q (B, T, H, dk) -> (B, KVH, G*T, dk): each KV head's G query heads as one matrix, rows g-major, so
    the query-key and probability-value products are plain batched matmuls (no transpose inside them:
    XLA:CPU ran the (B, T, KVH, G, dk) form of a 512-token chunk's products at about twice the time,
    measured ad hoc). Callers group once and pass the result to every segment's `partial_attend`."""
    b, t, h, dk = q.shape
    g = h // kvh
    if t == 1:
        return q.reshape(b, kvh, g, dk)
    return q.reshape(b, t, kvh, g, dk).transpose(0, 2, 3, 1, 4).reshape(b, kvh, g * t, dk)


def _scores(qg, k_t, spec: AttentionSpec, q_pos, k_pos, mask=None, q_limit=None):
    """qg (B, KVH, G*T, dk) (group_queries), k_t (B, KVH, dk, S) -> (B, KVH, G*T, S) float32: scaled, capped,
    masked. mask (B, T, S) bool: more keys to hide (other prompts of a packed row)."""
    b, kvh, rows, _ = qg.shape
    t = q_pos.shape[1]
    s = jnp.einsum("bkqd,bkds->bkqs", qg.astype(k_t.dtype), k_t, preferred_element_type=jnp.float32)
    s = s * spec.scale
    if spec.softcap is not None:
        s = spec.softcap * jnp.tanh(s / spec.softcap)
    visible = _visible(q_pos, k_pos, spec.window, spec.chunk, q_limit)
    if mask is not None:
        visible &= mask
    s = s.reshape(b, kvh, rows // t, t, -1)  # (B, KVH, G, T, S): the (B, T, S) mask broadcasts over heads
    return jnp.where(visible[:, None, None], s, _MASKED).reshape(b, kvh, rows, -1)


def out_shape(q, v) -> tuple[int, ...]:
    """(B, T, H, dv) for queries q (B, T, H, dk) and values v (..., dv)."""
    return (*q.shape[:3], v.shape[-1])


def attend(
    q: jax.Array,  # (B, T, H, dk)
    k_t: jax.Array,  # (B, KVH, dk, S)
    v: jax.Array,  # (B, KVH, S, dv)
    q_pos: jax.Array,  # (B, T) int32 absolute positions of the queries
    k_pos: jax.Array,  # (B, S) int32 absolute positions of the keys; < 0 = empty
    spec: AttentionSpec,
    sinks: jax.Array | None = None,  # (H,) f32
    mask: jax.Array | None = None,  # (B, T, S) bool, ANDed with the causal/window mask
) -> jax.Array:  # (B, T, H, dv)
    qg = group_queries(q, k_t.shape[1])
    return merge_partials([partial_attend(qg, k_t, v, q_pos, k_pos, spec, mask)], out_shape(q, v), q.dtype, sinks)


def partial_attend(qg, k_t, v, q_pos, k_pos, spec: AttentionSpec, mask=None, q_limit=None):
    """Attention of grouped queries qg (B, KVH, G*T, dk) (group_queries) over one key segment, unnormalized:
    (out (B, KVH, G*T, dv) float32, max, sum), max and sum (B, KVH, G*T, 1). Combine segments with
    `merge_partials`. q_limit: _visible's."""
    scores = _scores(qg, k_t, spec, q_pos, k_pos, mask, q_limit)
    m = jnp.max(scores, axis=-1, keepdims=True)
    p = jnp.exp(scores - m)
    out = jnp.einsum("bkqs,bksd->bkqd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out, m, jnp.sum(p, axis=-1, keepdims=True)


def merge_partials(parts, shape, dtype, sinks=None) -> jax.Array:
    """Online-softmax merge of `partial_attend` results -> `shape` (B, T, H, dv) in `dtype`.
    sinks (H,): one more logit per head in every softmax, with no value."""
    acc = parts[0]
    for part in parts[1:]:
        acc = merge_into(acc, part)
    out, m, total = acc
    b, t, h, dv = shape
    kvh = out.shape[1]
    g = h // kvh
    if sinks is not None:
        sink = jnp.broadcast_to(sinks.astype(jnp.float32).reshape(1, kvh, g, 1, 1), (1, kvh, g, t, 1))
        sink = sink.reshape(1, kvh, g * t, 1)
        new_m = jnp.maximum(m, sink)
        out, total = out * jnp.exp(m - new_m), total * jnp.exp(m - new_m) + jnp.exp(sink - new_m)
    out = (out / total).reshape(b, kvh, g, t, dv)
    return out.transpose(0, 3, 1, 2, 4).reshape(shape).astype(dtype)  # (B, T, KVH, G, dv): heads g-minor


def merge_into(acc, part):
    """Fold one `partial_attend` result into a running one (same shapes): the loop form of
    merge_partials."""
    (o1, m1, l1), (o2, m2, l2) = acc, part
    m = jnp.maximum(m1, m2)
    a, b = jnp.exp(m1 - m), jnp.exp(m2 - m)
    return o1 * a + o2 * b, m, l1 * a + l2 * b
