"""The TPU's in-place gated delta kernel (ops/gated_delta_tpu.py) in Pallas interpret mode against the XLA step
on gathered states: the rows' outputs, their new states where they live, and every other state untouched."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vsurge.ops.gated_delta import gated_delta_step
from vsurge.ops.gated_delta_tpu import gated_delta_pallas, usable

HK, HV, D = 2, 4, 128  # two value heads per key head; the kernel takes whole 128-lane tiles
SLOTS = np.array([3, 0, 5, 6, 6], np.int32)  # a row, a fresh row, an invalid row, two padding rows (spare slot 6)
FRESH = np.array([False, True, False, False, False])
VALID = np.array([True, True, False, False, False])


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, len(SLOTS), HK, D), np.float32)
    q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    v = rng.standard_normal((len(SLOTS), HV, D), np.float32)
    g = -np.abs(rng.standard_normal((len(SLOTS), HV))).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((len(SLOTS), HV))))).astype(np.float32)
    return q, k, v, g, beta


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_kernel_updates_each_row_where_it_lives(dtype):
    q, k, v, g, beta = inputs()
    states = jnp.asarray(0.5 * np.random.default_rng(1).standard_normal((7, HV, D, D)), dtype)  # (S+1, Hv, dk, dv)
    out, new = jax.jit(gated_delta_pallas, static_argnames="interpret")(
        (q, k, v, g, beta), states, SLOTS, FRESH, VALID, interpret=True)
    held = np.asarray(states.astype(jnp.float32))
    starts = np.where(FRESH[:, None, None, None], 0.0, held[SLOTS])
    want_out, want_states = gated_delta_step(q, k, v, g, beta, jnp.asarray(starts), VALID)
    np.testing.assert_allclose(np.asarray(out[:2]), np.asarray(want_out[:2]), rtol=1e-5, atol=1e-5)
    new = np.asarray(new.astype(jnp.float32))
    want = np.asarray(want_states.astype(dtype).astype(jnp.float32))
    ulp = 2.0 ** -7 if dtype == "bfloat16" else 1e-5  # (a sum's order may move a value across a rounding edge)
    for row in (0, 1):
        np.testing.assert_allclose(new[SLOTS[row]], want[row], rtol=ulp, atol=1e-5)
    np.testing.assert_array_equal(new[SLOTS[2]], held[SLOTS[2]])  # invalid: kept bit for bit
    np.testing.assert_array_equal(new[[1, 2, 4]], held[[1, 2, 4]])  # no row's slot: untouched


def test_the_kernel_is_chosen_only_for_a_tpu_program_of_whole_tiles():
    states = jnp.zeros((3, HV, D, D), jnp.bfloat16)
    assert not usable(states, D, D)  # this CPU: the C++ kernel's (or XLA's) path
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax, "default_backend", lambda: "tpu")
        assert usable(states, D, D)
        assert not usable(states, 64, D) and not usable(states, D, 96)
        assert not usable(states.astype(jnp.int8), D, D)
