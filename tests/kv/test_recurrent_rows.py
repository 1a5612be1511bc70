"""How the paged engine updates decode rows' recurrent states (kv/recurrent.run_packed): large states one row
after another in place on a CPU, gathered and scattered back together on an accelerator, the same numbers."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vsurge.kv import recurrent

D, SLOTS, N = 4, 6, 128  # decode rows; state rows (+1 spare); each state (N, N) float32 = 64 KiB


def step(inputs, state, valid):
    """A delta-rule-like step: inputs ((R, N),), state (R, N, N), valid (R,) -> (out (R, N), state)."""
    (x,) = inputs
    new = 0.9 * state + x[:, :, None] * x[:, None, :]
    new = jnp.where(valid[:, None, None], new, state)
    return jnp.einsum("rij,rj->ri", new, x), new


OP = recurrent.by_length(lambda *a: (_ for _ in ()).throw(AssertionError("no prompt rows here")), step,
                         row_by_row=True)


def run(platform: str, monkeypatch):
    monkeypatch.setattr(recurrent, "platform", lambda: platform)

    def decode(states, x, slots, positions):  # (a new function each run: JAX keeps traces by function)
        layout = SimpleNamespace(num_decode=D, chunk_pos=jnp.zeros((0, 1), jnp.int32), decode_slots=slots,
                                 decode_pos=positions[:, None])
        out, states, _, _ = recurrent.run_packed(OP, (x,), states, layout)
        return out, states

    rng = np.random.default_rng(0)
    states = jnp.asarray(rng.standard_normal((SLOTS + 1, N, N)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((1, D, N)) * 0.1, jnp.float32)
    slots = jnp.asarray([4, 0, 2, 5], jnp.int32)
    positions = jnp.asarray([7, 3, 0, -1], jnp.int32)  # a row resumes, one starts (position 0), one is padding
    jaxpr = str(jax.make_jaxpr(decode)(states, x, slots, positions))
    return decode(states, x, slots, positions), jaxpr, states


@pytest.mark.parametrize("platform, loops", [("cpu", True), ("tpu", False), ("gpu", False)])
def test_large_states_go_row_by_row_on_a_cpu_only(platform, loops, monkeypatch):
    (out, states), jaxpr, before = run(platform, monkeypatch)
    assert recurrent.one_row_at_a_time(OP, N * N * 4) == loops
    assert ("scan" in jaxpr) == loops  # the row loop, or one gather and scatter for all rows
    (want_out, want_states), _, _ = run("tpu" if loops else "cpu", monkeypatch)  # the other path
    np.testing.assert_allclose(out, want_out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(states, want_states, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(states[1], before[1])  # a slot no row names is untouched
    np.testing.assert_array_equal(states[5], before[5])  # the padding row's slot too


def test_small_states_are_batched_everywhere(monkeypatch):
    monkeypatch.setattr(recurrent, "platform", lambda: "cpu")
    assert not recurrent.one_row_at_a_time(OP, recurrent.ROW_BY_ROW_BYTES - 1)
    assert not recurrent.one_row_at_a_time(recurrent.by_length(None, step), N * N * 4)  # an op that did not opt in
