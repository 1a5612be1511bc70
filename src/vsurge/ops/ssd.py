"""Mamba-2 selective state space op (SSD) for the Mamba-2 hybrids: Granite 4.0-H, Nemotron-H, Falcon-H1.

Each head h keeps a float32 state S (P, N). Per token, with step dt (already softplus'd, biased and
clamped by the caller) and a negative per-head A:
    S <- exp(dt * A) * S + dt * x B^T;    y = S C          (x (P,), B and C (N,))
B and C come in G groups; group g serves the H/G consecutive heads g*H/G .. (g+1)*H/G - 1.

`ssd_step` runs that recurrence for one token per row (decode). `ssd_scan` computes the same thing
for a prompt chunk in the chunked "state space duality" form: inside each block of `chunk_size`
tokens the output is a masked attention-like product (C B^T weighted by the decays between the two
positions), each block's own contribution to its end state is one contraction, and only the
block-to-block state hand-over is a `lax.scan`. Neither adds the D skip: callers add D * x.

A token with `valid` False gets dt = 0 (and x, B, C = 0), so its decay is exp(0) = 1 and its input is 0:
right padding and padding rows leave the state exactly as it was.

The mixer around it (see the Granite/Nemotron-H references): in_proj -> split (gate z, xBC, dt);
depthwise causal conv + silu over xBC; split xBC -> (x, B, C); dt = clamp(softplus(dt + dt_bias));
A = -exp(A_log); y = ssd(...) + D * x; `grouped_gated_rms_norm(y, w, z)`; out_proj.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST  # the state is carried across the whole prompt: keep full f32 matmuls


def _mask_invalid(x, dt, B, C, valid):
    """Zero x, dt, B and C where valid is False (valid (b, T) or (b,), or None).

    dt = 0 alone would do for finite padding; zeroing the rest too keeps NaN/inf garbage in padded
    slots from leaking into valid outputs through 0 * NaN."""
    if valid is None:
        return x, dt, B, C
    v = valid[..., None]  # (b, T, 1) against dt; one more axis against x, B, C
    x, B, C = (jnp.where(v[..., None], t, 0.0) for t in (x, B, C))
    return x, jnp.where(v, dt, 0.0), B, C


def _segment_sum(a: jax.Array) -> jax.Array:
    """a (..., L) -> (..., L, L): out[l, s] = sum of a[i] for s < i <= l where l >= s, else -inf.

    Built as a cumulative sum of the masked terms (not cumsum[l] - cumsum[s]), so long decays do not
    lose precision to cancellation; -inf goes only where exp follows, giving exact zeros."""
    L = a.shape[-1]
    below = jnp.tril(jnp.ones((L, L), dtype=bool), -1)  # [i, s]: i > s
    terms = jnp.where(below, a[..., :, None], 0.0)  # (..., L, L): [i, s] = a[i] where i > s
    seg = jnp.cumsum(terms, axis=-2)  # [l, s] = sum_{s < i <= l} a[i]
    return jnp.where(jnp.tril(jnp.ones((L, L), dtype=bool)), seg, -jnp.inf)


def ssd_scan(x, dt, A, B, C, state, valid=None, *, chunk_size: int = 64):
    """Chunked SSD over a prompt chunk.

    x (b, T, H, P); dt (b, T, H) final step sizes; A (H,) negative; B, C (b, T, G, N), H % G == 0;
    state (b, H, P, N) initial state; valid (b, T) bool or None.
    Returns y (b, T, H, P) float32 without the D skip, and the final state (b, H, P, N) float32.
    Outputs at invalid positions are unspecified."""
    b, T, H, P = x.shape
    G, N = B.shape[-2:]
    R = H // G  # heads per group
    f32 = jnp.float32
    x, dt, B, C = _mask_invalid(x.astype(f32), dt.astype(f32), B.astype(f32), C.astype(f32), valid)

    L = min(chunk_size, T)  # a short prompt is one block of its own length, not a padded 64
    nc = -(-T // L)
    pad = nc * L - T
    if pad:  # zero dt, x, B, C: padded tokens neither decay nor feed the state
        x, dt, B, C = (jnp.pad(t, [(0, 0), (0, pad)] + [(0, 0)] * (t.ndim - 2)) for t in (x, dt, B, C))

    x = x.reshape(b, nc, L, G, R, P)
    dt = dt.reshape(b, nc, L, G, R)
    B = B.reshape(b, nc, L, G, N)
    C = C.reshape(b, nc, L, G, N)
    a = jnp.moveaxis(dt * A.astype(f32).reshape(G, R), 2, -1)  # (b, nc, G, R, L) log-decay per token
    xdt = x * dt[..., None]  # (b, nc, L, G, R, P) input scaled by its step

    seg = _segment_sum(a)  # (b, nc, G, R, L, L) log-decay from position s to l
    # Within a block: y[l] = sum_{s <= l} (C[l] . B[s]) exp(seg[l, s]) dt[s] x[s].
    cb = jnp.einsum("bclgn,bcsgn->bcgls", C, B, precision=_HI)  # (b, nc, G, L, L), shared by the group
    weights = cb[:, :, :, None] * jnp.exp(seg)  # (b, nc, G, R, L, L)
    y_diag = jnp.einsum("bcgrls,bcsgrp->bclgrp", weights, xdt, precision=_HI)

    # Each block's inputs, decayed to the block's end: its contribution to the state handed on.
    decay_to_end = jnp.exp(seg[..., -1, :])  # (b, nc, G, R, L)
    own = jnp.einsum("bcgrs,bcsgn,bcsgrp->bcgrpn", decay_to_end, B, xdt, precision=_HI)
    block_decay = jnp.exp(jnp.sum(a, axis=-1))  # (b, nc, G, R) whole-block decay

    def hand_over(s, inputs):  # s (b, G, R, P, N): state at the start of this block
        own_c, decay_c = inputs
        return s * decay_c[..., None, None] + own_c, s

    s0 = state.astype(f32).reshape(b, G, R, P, N)
    final, starts = jax.lax.scan(hand_over, s0, (jnp.moveaxis(own, 1, 0), jnp.moveaxis(block_decay, 1, 0)))
    starts = jnp.moveaxis(starts, 0, 1)  # (b, nc, G, R, P, N)

    # The carried-in state, read by C and decayed from the block start to each position.
    decay_from_start = jnp.exp(jnp.cumsum(a, axis=-1))  # (b, nc, G, R, L)
    y_off = jnp.einsum("bclgn,bcgrpn->bclgrp", C, starts, precision=_HI)
    y_off = y_off * jnp.moveaxis(decay_from_start, -1, 2)[..., None]

    y = (y_diag + y_off).reshape(b, nc * L, H, P)[:, :T]
    return y, final.reshape(b, H, P, N)


def ssd_step(x, dt, A, B, C, state, valid=None):
    """One token per row: x (b, H, P); dt (b, H); A (H,); B, C (b, G, N); state (b, H, P, N); valid (b,).

    Returns y (b, H, P) float32 without the D skip, and the new state (b, H, P, N) float32."""
    b, H, P = x.shape
    G, N = B.shape[-2:]
    R = H // G
    f32 = jnp.float32
    x, dt, B, C = _mask_invalid(x.astype(f32), dt.astype(f32), B.astype(f32), C.astype(f32), valid)
    decay = jnp.exp(dt * A.astype(f32)).reshape(b, G, R)  # (b, G, R); exactly 1 where invalid
    xdt = (x * dt[..., None]).reshape(b, G, R, P)
    s = state.astype(f32).reshape(b, G, R, P, N)
    s = s * decay[..., None, None] + xdt[..., None] * B[:, :, None, None, :]
    y = jnp.einsum("bgrpn,bgn->bgrp", s, C, precision=_HI)
    return y.reshape(b, H, P), s.reshape(b, H, P, N)


def grouped_gated_rms_norm(x, weight, gate, groups: int, eps: float, *, norm_before_gate: bool = False):
    """The Mamba-2 mixer's gated RMSNorm: x, gate (..., D), weight (D,), normalised within `groups`
    equal slices of D (the mixer's n_groups).

    Granite 4.0-H / Nemotron-H (norm_before_gate=False): in float32, x * silu(gate), then RMS-normalise
    each group, cast back to x.dtype, then times weight (the result takes torch's promotion of
    weight and x dtypes, as in the reference). Falcon-H1 with mamba_rms_norm (norm_before_gate from
    its config, True by default): normalise, times weight, times silu(gate), all in float32, then
    cast to x.dtype."""
    x32 = x.astype(jnp.float32)
    g32 = jax.nn.silu(gate.astype(jnp.float32))
    if not norm_before_gate:
        x32 = x32 * g32
    grouped = x32.reshape(*x.shape[:-1], groups, x.shape[-1] // groups)  # (..., groups, D/groups)
    normed = grouped * jax.lax.rsqrt(jnp.mean(grouped * grouped, axis=-1, keepdims=True) + eps)
    normed = normed.reshape(x.shape)
    if not norm_before_gate:
        return weight * normed.astype(x.dtype)
    return (weight.astype(jnp.float32) * normed * g32).astype(x.dtype)
