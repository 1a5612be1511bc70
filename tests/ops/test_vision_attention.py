"""The vision towers' attention (ops/vision._attention_blocks): one block at a time (a CPU's caches) and all
blocks in one batched product (an accelerator) give the same result, with and without a key mask, and match a
plain softmax attention."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from vsurge.ops.vision import _attention_blocks


def plain(q, k, v, scale, keys=None):
    """q (G, B, h, Q, d), k/v (G, h, T, d) -> (G, B, h, Q, d) float32, in float64 numpy."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = np.einsum("gbhqd,ghkd->gbhqk", q, k) * scale
    if keys is not None:
        s = np.where(np.asarray(keys)[:, None, None, None, :], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("gbhqk,ghkd->gbhqd", p / p.sum(-1, keepdims=True), v)


def test_blocks_one_at_a_time_and_batched_agree_with_plain_attention():
    rng = np.random.default_rng(0)
    g, b, h, q_len, t, d = 3, 2, 2, 8, 16, 8
    q = jnp.asarray(rng.normal(size=(g, b, h, q_len, d)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(g, h, t, d)), jnp.float32) for _ in range(2))
    keys = jnp.asarray(rng.random((g, t)) < 0.7).at[:, 0].set(True)  # every group sees at least one key
    for mask in (None, keys):
        want = plain(q, k, v, d ** -0.5, mask)
        looped = _attention_blocks(q, k, v, d ** -0.5, mask, one_at_a_time=True)
        batched = _attention_blocks(q, k, v, d ** -0.5, mask, one_at_a_time=False)
        np.testing.assert_allclose(np.asarray(looped), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(batched), want, rtol=1e-5, atol=1e-5)
