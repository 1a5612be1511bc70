"""Gated DeltaNet and short-convolution ops against transformers' PyTorch references (Qwen3-Next)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.qwen3_next import modeling_qwen3_next as ref

from vsurge.ops.gated_delta import (gated_delta_rule, gated_delta_step, gated_rms_norm, l2_normalize,
                                   unit_lower_inverse)
from vsurge.ops.short_conv import causal_conv, causal_conv_step

B, HK, HV, DK, DV = 2, 2, 4, 8, 6  # Hv = 2 * Hk, dk != dv
TOL = 1e-4

rule = jax.jit(gated_delta_rule, static_argnames="chunk_size")
step = jax.jit(gated_delta_step)
conv = jax.jit(causal_conv)
conv_step = jax.jit(causal_conv_step)


def close(got, want, tol=TOL):
    """Max error within tol relative to the reference's scale (values here are O(1))."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape
    err = np.max(np.abs(got - want)) / max(1.0, np.max(np.abs(want)))
    assert err < tol, err


def delta_inputs(T, seed=0):
    """q, k (B, T, Hk, dk) L2-normalised, v (B, T, Hv, dv), g <= 0, beta in (0, 1), state: numpy float32."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, B, T, HK, DK), np.float32)
    q, k = (x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6) for x in (q, k))
    v = rng.standard_normal((B, T, HV, DV), np.float32)
    g = np.log(1 / (1 + np.exp(-rng.standard_normal((B, T, HV)) - 2))).astype(np.float32)  # log sigmoid
    beta = (1 / (1 + np.exp(-rng.standard_normal((B, T, HV))))).astype(np.float32)
    state = (0.5 * rng.standard_normal((B, HV, DK, DV))).astype(np.float32)
    return q, k, v, g, beta, state


def torch_delta(fn, q, k, v, g, beta, state, **kw):
    t = [torch.from_numpy(np.array(x)) for x in (q, k, v, g, beta)]
    out, final = fn(*t, initial_state=torch.from_numpy(state).clone(), output_final_state=True, **kw)
    return out.numpy(), final.numpy()


def test_l2_normalize_matches_reference():
    x = np.random.default_rng(1).standard_normal((3, 5, 8), np.float32)
    close(l2_normalize(x), ref.l2norm(torch.from_numpy(x)).numpy(), 1e-6)


@pytest.mark.parametrize("size", [1, 5, 16, 37, 64])
def test_unit_lower_inverse_inverts_the_unit_lower_triangle(size):
    a = np.random.default_rng(size).uniform(-0.5, 0.5, (2, 3, size, size)).astype(np.float32)
    inv = np.asarray(jax.jit(unit_lower_inverse)(a))  # (2, 3, size, size); a's diagonal and upper part unused
    want = np.linalg.inv(np.tril(a.astype(np.float64), -1) + np.eye(size))
    close(inv, want, 1e-5)
    assert np.all(np.triu(inv, 1) == 0) and np.all(np.diagonal(inv, axis1=-2, axis2=-1) == 1)


def test_the_chunked_rule_calls_no_lapack_kernel():
    """jaxlib's CPU trsm parks pool threads waiting on the pool: two at once hung a 2-core step forever."""
    args = map(jnp.asarray, delta_inputs(37))
    hlo = jax.jit(gated_delta_rule, static_argnames="chunk_size").lower(*args, chunk_size=16).as_text()
    assert "custom_call" not in hlo and "lapack" not in hlo


@pytest.mark.parametrize("T, chunk", [(37, 16), (5, 64), (80, 16)])  # 3 chunks unrolled, 1, 5 in a loop
def test_chunked_matches_torch_chunk_and_recurrent(T, chunk):
    args = delta_inputs(T)
    out, final = rule(*map(jnp.asarray, args), chunk_size=chunk)
    assert out.dtype == jnp.float32 and final.shape == (B, HV, DK, DV)
    for fn, kw in ((ref.torch_chunk_gated_delta_rule, {"chunk_size": chunk}), (ref.torch_recurrent_gated_delta_rule, {})):
        want_out, want_final = torch_delta(fn, *args, **kw)
        close(out, want_out)
        close(final, want_final)


def test_two_calls_carry_the_state():
    q, k, v, g, beta, state = delta_inputs(37)
    whole, whole_final = rule(q, k, v, g, beta, state, chunk_size=16)
    first, mid = rule(q[:, :23], k[:, :23], v[:, :23], g[:, :23], beta[:, :23], state, chunk_size=16)
    second, final = rule(q[:, 23:], k[:, 23:], v[:, 23:], g[:, 23:], beta[:, 23:], mid, chunk_size=16)
    close(jnp.concatenate([first, second], axis=1), whole)
    close(final, whole_final)


def test_valid_mask_right_padding_and_empty_row():
    q, k, v, g, beta, state = delta_inputs(37)
    n = 23  # row 0 has 23 real tokens, row 1 none
    valid = np.zeros((B, 37), bool)
    valid[0, :n] = True
    out, final = rule(q, k, v, g, beta, state, valid, chunk_size=16)
    # the unpadded rows, at the shape test_two_calls_carry_the_state compiled
    alone, alone_final = rule(q[:, :n], k[:, :n], v[:, :n], g[:, :n], beta[:, :n], state, chunk_size=16)
    close(out[0, :n], alone[0])
    close(final[0], alone_final[0])
    np.testing.assert_array_equal(np.asarray(final[1]), state[1])  # an all-invalid row keeps its state exactly
    assert np.all(np.isfinite(np.asarray(out)))


def test_steps_equal_chunked():
    T = 9
    q, k, v, g, beta, state = delta_inputs(T, seed=3)
    want, want_final = rule(q, k, v, g, beta, state, chunk_size=4)
    s, outs = jnp.asarray(state), []
    for t in range(T):
        o, s = step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], s)
        outs.append(o)
    close(jnp.stack(outs, axis=1), want)
    close(s, want_final)
    # a row with valid False keeps its state exactly
    _, kept = step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], s, np.array([True, False]))
    np.testing.assert_array_equal(np.asarray(kept[1]), np.asarray(s[1]))


def test_gated_rms_norm_matches_reference():
    rng = np.random.default_rng(4)
    x, gate = rng.standard_normal((2, 3, 16), np.float32), rng.standard_normal((2, 3, 16), np.float32)
    weight = (1 + 0.1 * rng.standard_normal(16)).astype(np.float32)
    norm = ref.Qwen3NextRMSNormGated(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(weight))
        want = norm(torch.from_numpy(x), torch.from_numpy(gate)).numpy()
    close(gated_rms_norm(x, weight, gate, 1e-6), want, 1e-6)


C, K = 5, 4


def conv_inputs(T, seed=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, T, C), np.float32)
    return x, rng.standard_normal((C, K), np.float32), rng.standard_normal(C, np.float32)


def test_causal_conv_matches_reference_full_and_steps():
    T = 7
    x, w, b = conv_inputs(T)
    tx, tw, tb = torch.from_numpy(x).transpose(1, 2), torch.from_numpy(w), torch.from_numpy(b)
    y, window = conv(x, w, b, np.zeros((B, K - 1, C), np.float32))
    close(y, ref.causal_conv1d_fn(tx, tw, tb).transpose(1, 2).numpy(), 1e-6)
    np.testing.assert_array_equal(np.asarray(window), x[:, -(K - 1):])
    # decode, step by step, against causal_conv1d_update with a (B, C, K-1) state
    t_state, win = torch.zeros(B, C, K - 1), jnp.zeros((B, K - 1, C))
    for t in range(T):
        want = ref.causal_conv1d_update(tx[:, :, t:t + 1], t_state, tw, tb)[:, :, 0].numpy()
        got, win = conv_step(x[:, t], w, b, win)
        close(got, want, 1e-6)
        np.testing.assert_array_equal(np.asarray(win), t_state.transpose(1, 2).numpy())
    _, kept = conv_step(x[:, 0], w, b, win, np.array([False, True]))
    np.testing.assert_array_equal(np.asarray(kept[0]), np.asarray(win[0]))


def test_causal_conv_split_prompt_and_padding():
    T = 7
    x, w, b = conv_inputs(T, seed=6)
    zeros = np.zeros((B, K - 1, C), np.float32)
    whole, whole_win = conv(x, w, b, zeros)
    first, mid = conv(x[:, :2], w, b, zeros)  # shorter than K-1 tokens: the window keeps zeros
    np.testing.assert_array_equal(np.asarray(mid[:, 0]), 0.0)
    second, win = conv(x[:, 2:], w, b, mid)
    close(jnp.concatenate([first, second], axis=1), whole, 1e-6)
    np.testing.assert_array_equal(np.asarray(win), np.asarray(whole_win))
    # right padding: row 0 has 5 real tokens, row 1 has 1 (< K-1), and padding garbage after them
    valid = np.arange(T)[None] < np.array([[5], [1]])
    y, padded_win = conv(x, w, b, zeros, valid)
    for row, n in enumerate((5, 1)):
        y_alone, win_alone = conv(x[row:row + 1, :n], w, b, zeros[:1])
        close(y[row:row + 1, :n], y_alone, 1e-6)
        np.testing.assert_array_equal(np.asarray(padded_win[row]), np.asarray(win_alone[0]))
    # a row with no valid token keeps its window
    _, kept = conv(x, w, b, np.asarray(whole_win), np.zeros((B, T), bool))
    np.testing.assert_array_equal(np.asarray(kept), np.asarray(whole_win))


# The decode kernels (kernels/recurrent_decode.cc): rows at shuffled slots of the engine's state array,
# a fresh row (zero start), an invalid row (its state kept bit for bit), a padding row whose slot is out
# of range (skipped, output 0); bfloat16 states round once, to the nearest, as XLA's convert.
SLOTS = np.array([4, 1, 0, 99], np.int32)
FRESH = np.array([False, True, False, False])
VALID = np.array([True, True, False, True])


def held_states(shape, dtype, seed=2):
    """(7, *shape) random states representable in `dtype` (float32 numpy), skipped without the kernels."""
    from vsurge import kernels

    if not kernels.available():
        pytest.skip(f"C++ kernels not built: {kernels.unavailable_reason()}")
    states = (0.5 * np.random.default_rng(seed).standard_normal((7, *shape))).astype(np.float32)
    return np.asarray(jnp.asarray(states, dtype).astype(jnp.float32))


def check_states(new, states, want, dtype):
    """`new` (the kernel's, in `dtype`) against `want` (the real rows' new states, float32)."""
    new = np.asarray(jnp.asarray(new).astype(jnp.float32))
    want = np.asarray(jnp.asarray(want).astype(dtype).astype(jnp.float32))
    ulp = 2.0 ** -7 if dtype == "bfloat16" else 1e-6  # (a sum's order may move a value across a rounding edge)
    for row, slot in enumerate(SLOTS[:2]):
        np.testing.assert_allclose(new[slot], want[row], rtol=ulp, atol=1e-6)
    np.testing.assert_array_equal(new[SLOTS[2]], states[SLOTS[2]])  # invalid: kept bit for bit
    untouched = [s for s in range(len(states)) if s not in SLOTS]
    np.testing.assert_array_equal(new[untouched], states[untouched])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_in_place_delta_kernel_equals_the_step(dtype):
    from vsurge.ops.gated_delta import gated_delta_in_place

    q, k, v, g, beta, _ = delta_inputs(1, seed=11)
    q, k, v, g, beta = (np.concatenate([x, x[::-1] * 0.5])[:, 0] for x in (q, k, v, g, beta))  # 4 rows
    states = held_states((HV, DK, DV), dtype)
    out, new = jax.jit(gated_delta_in_place)((q, k, v, g, beta), jnp.asarray(states, dtype), SLOTS, FRESH, VALID)
    starts = np.where(FRESH[:3, None, None, None], 0.0, states[SLOTS[:3]])
    want_out, want_states = step(q[:3], k[:3], v[:3], g[:3], beta[:3], starts, VALID[:3])
    close(out[:3], want_out, 1e-5)
    np.testing.assert_array_equal(np.asarray(out[3]), 0.0)
    check_states(new, states, want_states, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bias", [True, False])
def test_the_in_place_conv_kernel_equals_the_step(dtype, bias):
    from vsurge.ops.short_conv import causal_conv_in_place

    x, weight, b = conv_inputs(2, seed=9)
    x = x.reshape(4, C)
    b = b if bias else None
    windows = held_states((K - 1, C), dtype)
    y, new = jax.jit(partial(causal_conv_in_place, weight=weight, bias=b))((x,), jnp.asarray(windows, dtype), SLOTS,
                                                                            FRESH, VALID)
    starts = np.where(FRESH[:3, None, None], 0.0, windows[SLOTS[:3]])
    want_y, want_windows = conv_step(x[:3], weight, b, starts, VALID[:3])
    close(y[:3], want_y, 1e-5)
    np.testing.assert_array_equal(np.asarray(y[3]), 0.0)
    check_states(new, windows, want_windows, dtype)
