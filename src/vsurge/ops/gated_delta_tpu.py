"""The gated delta rule's decode step on a TPU: one Pallas kernel that reads each decode row's state where it
lives in the paged engine's state array and writes it back there, once each way (the TPU's counterpart of the
CPU's kernels/recurrent_decode.cc).

XLA's own form gathers the rows' states, computes, and scatters them back. On a v5e that was ~0.2 ms a layer
for the ~0.5B Qwen3.5-shaped hybrid at 32 rows (gather 52 us, scatter 75 us, the update's fusion and the
memory-space copies around them; `benchmarks/roofline.py --models hybrid --trace`, 2026-12-07) where the
bytes, 32 rows x 512 KiB read and written, take ~41 us at 819 GB/s.

One grid step is one row: its state block (1, Hv, dk, dv) is fetched from `states[slots[r]]` (the slots are
prefetched scalars) while the previous row computes, and written back to the same place (the state array is
aliased to the output). Per value head, both reads of the state are one (8, dk) @ (dk, dv) product (rows
k, q and zeros) and the rank-one update one (8, dk)^T @ (8, dv) product, in float32 on the MXU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

_ROWS = 8  # sublanes of a float32 tile: k, q and six zero rows make one MXU operand
_HI = jax.lax.Precision.HIGHEST


def usable(states, dk: int, dv: int) -> bool:
    """Whether the kernel serves `states` (S+1, Hv, dk, dv) in the program being traced: a TPU program on one
    device, float32 or bfloat16 states, whole 128-lane tiles."""
    from ..kernels import unsplit

    return (jax.default_backend() == "tpu" and unsplit() and dk % 128 == 0 and dv % 128 == 0
            and jnp.dtype(states.dtype) in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)))


def _kernel(slots_ref, fresh_ref, decay_ref, beta_ref, kq_ref, v_ref, state_ref, out_ref, new_ref, *, heads: int):
    """kq (1, Hv, 8, dk): rows k, q, zeros; v (1, Hv, dv); state (1, Hv, dk, dv) -> out (1, Hv, dv) float32 and
    the new state; decay, beta (R * Hv,) and fresh (R,) in scalar memory."""
    r = pl.program_id(0)
    keep = jnp.where(fresh_ref[r] != 0, 0.0, 1.0).astype(jnp.float32)  # a fresh row starts from zeros
    first = jax.lax.broadcasted_iota(jnp.int32, (_ROWS, 1), 0) == 0
    for h in range(heads):
        decay, beta = decay_ref[r * heads + h], beta_ref[r * heads + h]
        s = state_ref[0, h].astype(jnp.float32) * keep  # (dk, dv)
        kq = kq_ref[0, h]  # (8, dk)
        read = jnp.dot(kq, s, precision=_HI, preferred_element_type=jnp.float32)  # (8, dv): k^T S, q^T S
        delta = (v_ref[0, pl.ds(h, 1), :].astype(jnp.float32) - decay * read[0:1]) * beta  # (1, dv)
        qk = jnp.sum(kq[0:1] * kq[1:2], axis=1, keepdims=True)  # (1, 1)
        out_ref[0, pl.ds(h, 1), :] = decay * read[1:2] + qk * delta
        k_only = jnp.where(first, kq, 0.0)  # (8, dk): row 0 is k
        outer = jax.lax.dot_general(k_only, jnp.broadcast_to(delta, (_ROWS, delta.shape[1])),
                                    (((0,), (0,)), ((), ())), precision=_HI,
                                    preferred_element_type=jnp.float32)  # (dk, dv) = k delta^T
        new_ref[0, h] = (s * decay + outer).astype(new_ref.dtype)


def gated_delta_pallas(inputs, states, slots, fresh, valid, interpret: bool = False):
    """`ops.gated_delta.gated_delta_step` on decode rows whose states live in `states` (S+1, Hv, dk, dv) at
    `slots` (R,): inputs (q, k (R, Hk, dk); v (R, Hv, dv); g, beta (R, Hv)); fresh (R,) bool: start from a
    zero state; valid (R,) bool: a row with False keeps its state. Returns (out (R, Hv, dv) in v.dtype,
    states). Rows' slots are distinct but for padding rows, which all take the spare last slot."""
    from jax.experimental.pallas import tpu as pltpu

    q, k, v, g, beta = inputs
    r, heads, dv = v.shape
    dk = k.shape[-1]
    groups = heads // k.shape[1]
    keep = valid[:, None]  # g = beta = 0 where invalid: the identity update (R, Hv)
    g, beta = jnp.where(keep, g.astype(jnp.float32), 0.0), jnp.where(keep, beta.astype(jnp.float32), 0.0)
    q = jnp.repeat(q.astype(jnp.float32), groups, axis=1) * (dk ** -0.5)  # (R, Hv, dk)
    k = jnp.repeat(k.astype(jnp.float32), groups, axis=1)
    kq = jnp.zeros((r, heads, _ROWS, dk), jnp.float32).at[:, :, 0].set(k).at[:, :, 1].set(q)  # (R, Hv, 8, dk)
    row = lambda i, slots, *_: (i, 0, 0)  # noqa: E731
    at_slot = lambda i, slots, *_: (slots[i], 0, 0, 0)  # noqa: E731
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=4, grid=(r,),
        in_specs=[pl.BlockSpec((1, heads, _ROWS, dk), lambda i, *_: (i, 0, 0, 0)),
                  pl.BlockSpec((1, heads, dv), row),
                  pl.BlockSpec((1, heads, dk, dv), at_slot)],
        out_specs=[pl.BlockSpec((1, heads, dv), row), pl.BlockSpec((1, heads, dk, dv), at_slot)])
    out, states = pl.pallas_call(
        functools.partial(_kernel, heads=heads), grid_spec=spec,
        out_shape=(jax.ShapeDtypeStruct((r, heads, dv), jnp.float32), jax.ShapeDtypeStruct(states.shape, states.dtype)),
        input_output_aliases={6: 1},  # (operands count the 4 scalars first): states -> the new states
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=interpret,
    )(slots.astype(jnp.int32), fresh.astype(jnp.int32), jnp.exp(g).reshape(-1), beta.reshape(-1), kq, v, states)
    return out.astype(v.dtype), states

