"""Gated DeltaNet (Qwen3-Next / Qwen3.5 linear attention): the gated delta rule and its helpers.

Each value head keeps a float32 state S (dk, dv). Per token, with decay a = exp(g) and rate beta:
    S <- a * S;   S <- S + k (beta * (v - k^T S))^T;   out = (q * dk**-0.5)^T S
`gated_delta_step` runs that recurrence for one token per row (decode). `gated_delta_rule` computes
the same thing for a prompt chunk in the chunkwise-parallel form: inside each block of `chunk_size`
tokens the sequential delta updates are folded into one unit-lower-triangular solve (the WY / UT
transform), and only the block-to-block state hand-over is a `lax.scan`. A token with `valid`
False gets g = 0 and beta = 0, which makes its update the identity: right padding and padding rows
leave the state as it was.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST  # the state is carried across the whole prompt: keep full f32 matmuls
# Chunks of a prompt row computed without a loop: XLA:CPU runs a loop's small per-head dots one
# iteration at a time and copies what the loop carries; the paged engine's rows are one page (2 chunks)
UNROLLED_CHUNKS = 4


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x (..., d) -> (..., d) float32: x / sqrt(sum(x^2) + eps), like the reference's l2norm.

    Float32 out, because the reference normalises q and k inside the kernel after casting to float32."""
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + eps)


def gated_rms_norm(x: jax.Array, weight: jax.Array, gate: jax.Array, eps: float) -> jax.Array:
    """Qwen3-Next RMSNormGated: x, gate (..., D), weight (D,) -> (..., D) in x.dtype.

    Normalise in float32, scale by weight in x's dtype (rounding like the reference), then gate
    with silu(gate) in float32."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    scaled = weight.astype(x.dtype) * normed.astype(x.dtype)
    return (scaled.astype(jnp.float32) * jax.nn.silu(gate.astype(jnp.float32))).astype(x.dtype)


def _mask_invalid(g, beta, valid):
    """g, beta (..., Hv); valid (...) bool or None -> g, beta float32 with invalid tokens set to 0."""
    g, beta = g.astype(jnp.float32), beta.astype(jnp.float32)
    if valid is None:
        return g, beta
    keep = valid[..., None]
    return jnp.where(keep, g, 0.0), jnp.where(keep, beta, 0.0)


def gated_delta_step(q, k, v, g, beta, state, valid=None):
    """One recurrent step per row (decode).

    q, k (B, Hk, dk); v (B, Hv, dv); g, beta (B, Hv); state (B, Hv, dk, dv) float32;
    valid (B,) bool or None. Returns out (B, Hv, dv) in v.dtype and the new state float32;
    a row with valid False keeps its state exactly.

    The state is read once and written once (at batch 32 it is most of the step's bytes): with
    a = exp(g), k^T (a S) = a (k^T S) and q^T S' = a (q^T S) + (q . k) delta, so both reads come
    from one product of [k; q] with the old state, and the update is one pass."""
    groups = v.shape[1] // k.shape[1]
    q = jnp.repeat(q.astype(jnp.float32), groups, axis=1)  # (B, Hv, dk)
    k = jnp.repeat(k.astype(jnp.float32), groups, axis=1)  # (B, Hv, dk)
    q = q * (q.shape[-1] ** -0.5)
    g, beta = _mask_invalid(g, beta, valid)  # (B, Hv)
    decay = jnp.exp(g)  # exp(0) = 1 and beta = 0 where invalid: the state is kept exactly
    state = state.astype(jnp.float32)
    read = jnp.einsum("bhnk,bhkv->bhnv", jnp.stack([k, q], axis=2), state, precision=_HI)  # (B, Hv, 2, dv)
    predicted = decay[..., None] * read[:, :, 0]  # what the decayed state already recalls for k
    delta = (v.astype(jnp.float32) - predicted) * beta[..., None]  # (B, Hv, dv); 0 where invalid
    out = decay[..., None] * read[:, :, 1] + jnp.sum(q * k, axis=-1, keepdims=True) * delta  # (B, Hv, dv)
    s = state * decay[..., None, None] + k[..., :, None] * delta[..., None, :]  # (B, Hv, dk, dv)
    return out.astype(v.dtype), s


def gated_delta_in_place(inputs, states, slots, fresh, valid):
    """`gated_delta_step` on decode rows whose states live in the paged engine's `states` (S+1, Hv,
    dk, dv) (float32 or bfloat16) at `slots` (R,), by the C++ kernel (kernels/recurrent_decode.cc), which
    reads and writes each row's state where it is, once each way: inputs (q, k, v, g, beta) of R rows
    as `gated_delta_step` takes them; fresh (R,) bool: start from a zero state; valid (R,) bool.
    Returns (out (R, Hv, dv) in v.dtype, states), or None where no kernel can run (another dtype, a mesh of
    several devices: the states are split over heads; a CPU without the kernels). On a TPU the Pallas kernel
    of ops/gated_delta_tpu.py does the same."""
    from .. import kernels
    from . import gated_delta_tpu

    if gated_delta_tpu.usable(states, inputs[1].shape[-1], inputs[2].shape[-1]):
        return gated_delta_tpu.gated_delta_pallas(inputs, states, slots, fresh, valid)
    if not kernels.in_place_usable(states):
        return None
    q, k, v, g, beta = inputs
    g, beta = _mask_invalid(g, beta, valid)
    q = q.astype(jnp.float32) * (q.shape[-1] ** -0.5)
    call = jax.ffi.ffi_call(kernels.GATED_DELTA_TARGET,
                            (jax.ShapeDtypeStruct(v.shape, jnp.float32), jax.ShapeDtypeStruct(states.shape, states.dtype)),
                            input_output_aliases={0: 1}, vmap_method="sequential")
    out, states = call(states, q, k.astype(jnp.float32), v.astype(jnp.float32), g, beta, slots.astype(jnp.int32),
                       fresh.astype(jnp.int32))
    return out.astype(v.dtype), states


def unit_lower_inverse(a: jax.Array) -> jax.Array:
    """a (..., C, C) -> (I + strict_lower(a))^-1 (..., C, C) float32, by recursive 2x2 block inversion.

    Plain batched matmuls, not LAPACK's trsm: jaxlib's CPU trsm splits its batch over XLA's intra-op
    pool and parks the calling pool thread until the pieces finish, so two solves running at once on a
    2-thread pool wait on each other forever (seen: a hybrid model's step that never ended). The
    reference (transformers' chunked gated delta rule) also inverts this matrix, by forward substitution.
    [[X, 0], [Y, Z]]^-1 = [[X^-1, 0], [-Z^-1 Y X^-1, Z^-1]], from 1x1 blocks up to the whole matrix."""
    C = a.shape[-1]
    P = 1 << max(C - 1, 0).bit_length()  # padded to a power of two with identity rows: same inverse on top
    lower = jnp.tril(a.astype(jnp.float32), -1)
    lower = jnp.pad(lower, [(0, 0)] * (a.ndim - 2) + [(0, P - C), (0, P - C)])  # (..., P, P)
    batch = lower.shape[:-2]
    inv = jnp.ones((*batch, P, 1, 1), jnp.float32)  # the inverses of the 1x1 diagonal blocks
    size = 1
    while size < P:
        n = P // (2 * size)  # diagonal blocks of twice the size
        pairs = inv.reshape(*batch, n, 2, size, size)
        top, bottom = pairs[..., 0, :, :], pairs[..., 1, :, :]  # (..., n, size, size) X^-1, Z^-1
        blocks = jnp.diagonal(lower.reshape(*batch, n, 2 * size, n, 2 * size), axis1=-4, axis2=-2)
        below = jnp.moveaxis(blocks, -1, -3)[..., size:, :size]  # (..., n, size, size) Y
        corner = -jnp.einsum("...ij,...jk,...kl->...il", bottom, below, top, precision=_HI)
        zeros = jnp.zeros_like(top)
        inv = jnp.concatenate([jnp.concatenate([top, zeros], -1), jnp.concatenate([corner, bottom], -1)], -2)
        size *= 2
    return inv[..., 0, :C, :C]


def gated_delta_rule(q, k, v, g, beta, state, valid=None, *, chunk_size: int = 64):
    """Chunkwise-parallel gated delta rule over a prompt chunk.

    q, k (B, T, Hk, dk) (already L2-normalised); v (B, T, Hv, dv); g (B, T, Hv) log decay <= 0;
    beta (B, T, Hv); state (B, Hv, dk, dv) float32; valid (B, T) bool or None.
    Returns out (B, T, Hv, dv) in v.dtype (garbage on invalid tokens) and the final state float32."""
    B, T, Hk, dk = k.shape
    Hv, dv = v.shape[2], v.shape[3]
    out_dtype = v.dtype
    C = min(chunk_size, T)  # a short prompt row is one chunk of its own length, not padded to 64
    N = -(-T // C)  # number of chunks
    pad = N * C - T

    g, beta = _mask_invalid(g, beta, valid)  # (B, T, Hv)
    per_v_head = lambda x: jnp.repeat(x.astype(jnp.float32), Hv // Hk, axis=2)  # noqa: E731  (B, T, Hv, dk)
    q, k, v = per_v_head(q) * (dk**-0.5), per_v_head(k), v.astype(jnp.float32)

    def chunked(x):  # (B, T, Hv, ...) -> (B, Hv, N, C, ...); padded tokens have g = beta = 0: identity updates
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape(B, N, C, *x.shape[2:])
        return jnp.moveaxis(x, 3, 1)

    q, k, v, g, beta = map(chunked, (q, k, v, g, beta))  # q, k (B,Hv,N,C,dk); v (..,C,dv); g, beta (B,Hv,N,C)

    cum = jnp.cumsum(g, axis=-1)  # (B, Hv, N, C) log decay from the chunk start through token i
    causal = jnp.tril(jnp.ones((C, C), dtype=bool))  # i >= j
    # decay between token j and token i of a chunk; the upper triangle would be exp(positive): mask first
    gap = jnp.where(causal, cum[..., :, None] - cum[..., None, :], 0.0)  # (B, Hv, N, C, C)
    decay = jnp.where(causal, jnp.exp(gap), 0.0)

    k_beta = k * beta[..., None]  # (B, Hv, N, C, dk)
    v_beta = v * beta[..., None]  # (B, Hv, N, C, dv)
    # UT transform: (I + strict_lower(beta k k^T * decay)) folds the chunk's sequential delta updates
    system = jnp.einsum("...ik,...jk->...ij", k_beta, k, precision=_HI) * decay  # (B, Hv, N, C, C)
    inverse = unit_lower_inverse(system)  # (B, Hv, N, C, C)
    solve = lambda rhs: jnp.einsum("...ij,...jd->...id", inverse, rhs, precision=_HI)  # noqa: E731
    u = solve(v_beta)  # (B, Hv, N, C, dv) values to write, before subtracting what the state predicts
    w = solve(k_beta * jnp.exp(cum)[..., None])  # (B, Hv, N, C, dk) decayed keys that read the old state

    intra = jnp.einsum("...ik,...jk->...ij", q, k, precision=_HI) * decay  # (B, Hv, N, C, C)
    q_read = q * jnp.exp(cum)[..., None]  # (B, Hv, N, C, dk) queries reading the chunk-start state
    last = cum[..., -1:]  # (B, Hv, N, 1) log decay over the whole chunk
    k_write = k * jnp.exp(last - cum)[..., None]  # (B, Hv, N, C, dk): decay from token i to chunk end
    chunk_decay = jnp.exp(last)[..., None]  # (B, Hv, N, 1, 1)

    def step(s, xs):  # s (B, Hv, dk, dv): the state at the chunk start
        u_c, w_c, q_c, k_c, intra_c, decay_c = xs
        v_new = u_c - jnp.einsum("bhck,bhkv->bhcv", w_c, s, precision=_HI)  # (B, Hv, C, dv) corrections
        out = (jnp.einsum("bhck,bhkv->bhcv", q_c, s, precision=_HI)
               + jnp.einsum("bhij,bhjv->bhiv", intra_c, v_new, precision=_HI))
        s = s * decay_c + jnp.einsum("bhck,bhcv->bhkv", k_c, v_new, precision=_HI)
        return s, out

    per_chunk = lambda x: jnp.moveaxis(x, 2, 0)  # noqa: E731  (B, Hv, N, ...) -> (N, B, Hv, ...)
    xs = tuple(map(per_chunk, (u, w, q_read, k_write, intra, chunk_decay)))
    # a prompt row of a few chunks (the paged engine's) unrolled: no loop
    final, out = jax.lax.scan(step, state.astype(jnp.float32), xs, unroll=N <= UNROLLED_CHUNKS)  # (N, B, Hv, C, dv)
    out = jnp.transpose(out, (1, 0, 3, 2, 4)).reshape(B, N * C, Hv, dv)[:, :T]
    return out.astype(out_dtype), final
