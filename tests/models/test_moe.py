"""Mixture of experts: routing equals transformers', only routed experts compute, both dispatches agree."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import vsurge
from vsurge.ops.moe import experts, route
from tiny_models import chosen

MOE = chosen("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "deepseek_v2", "deepseek_v3")


def torch_router(torch_model, layer: int):
    mlp = torch_model.model.layers[layer].mlp
    return getattr(mlp, "router", None) or mlp.gate


@pytest.mark.parametrize("name", MOE)
def test_routing_equals_transformers_on_a_batch(name, tiny_checkpoints):
    folder, torch_model = tiny_checkpoints[name]
    model, _ = vsurge.load(folder, dtype=jnp.float32, progress=False)
    layer = next(i for i in range(model.config.num_layers) if model.config.is_moe(i))
    hidden = np.random.default_rng(0).normal(0, 1, (64, model.config.hidden_size)).astype(np.float32)
    with torch.no_grad():
        _, ref_weights, ref_ids = torch_router(torch_model, layer)(torch.tensor(hidden))
    w = model.layers[layer].weights()
    logits = hidden @ np.asarray(w["router"])
    if "router_bias" in w:
        logits = logits + np.asarray(w["router_bias"])
    ids, weights = route(jnp.asarray(logits), model.config.routing, w.get("router_correction"))
    order = np.argsort(np.asarray(ids), axis=-1)  # the same experts, in any order
    ref_order = np.argsort(ref_ids.numpy(), axis=-1)
    np.testing.assert_array_equal(np.take_along_axis(np.asarray(ids), order, -1),
                                  np.take_along_axis(ref_ids.numpy(), ref_order, -1))
    np.testing.assert_allclose(np.take_along_axis(np.asarray(weights), order, -1),
                               np.take_along_axis(ref_weights.float().numpy(), ref_order, -1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation,biases,scale_inputs", [("silu", False, False), ("swiglu_oai", True, False),
                                                           ("silu", False, True)])
def test_loop_and_grouped_matmul_dispatch_equal_the_dense_reference(activation, biases, scale_inputs):
    """The dispatches (the loop over routed experts, ragged_dot: TPU's, and the C++ kernel: CPU decode's)
    against every token
    through its k experts, computed one by one in numpy; uneven loads, an expert with no rows.
    scale_inputs: each expert's input times its weight instead of its output (Llama 4)."""
    rng = np.random.default_rng(1)
    n, d, f, e, k = 37, 16, 12, 6, 2
    x = rng.normal(0, 1, (n, d)).astype(np.float32)
    ids = rng.choice([0, 1, 2, 4, 5], (n, k))  # expert 3 gets nothing
    ids[:, 1] = np.where(ids[:, 1] == ids[:, 0], (ids[:, 0] + 1) % e, ids[:, 1])
    weights = rng.uniform(0.1, 1, (n, k)).astype(np.float32)
    w_gu, w_d = rng.normal(0, 0.3, (e, d, 2 * f)).astype(np.float32), rng.normal(0, 0.3, (e, f, d)).astype(np.float32)
    b_gu = rng.normal(0, 0.1, (e, 2 * f)).astype(np.float32) if biases else None
    b_d = rng.normal(0, 0.1, (e, d)).astype(np.float32) if biases else None
    from vsurge.ops.mlp import gated

    want = np.zeros((n, d), np.float32)
    for t in range(n):
        for j in range(k):
            h = (weights[t, j] * x[t] if scale_inputs else x[t]) @ w_gu[ids[t, j]] + (b_gu[ids[t, j]] if biases else 0)
            y = np.asarray(gated(jnp.asarray(h), activation)) @ w_d[ids[t, j]] + (b_d[ids[t, j]] if biases else 0)
            want[t] += y if scale_inputs else weights[t, j] * y
    args = [jnp.asarray(a) if a is not None else None for a in (x, ids, weights, w_gu, w_d, b_gu, b_d)]
    from vsurge import kernels

    cpp = ("cpp",) if kernels.available() and activation == "silu" and not biases else ()  # (its cases)
    for impl in ("loop", "ragged", *cpp):
        got = jax.jit(lambda *a: experts(*a, activation=activation, impl=impl, scale_inputs=scale_inputs))(*args)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4, err_msg=impl)


def test_the_cpp_dispatch_asked_for_where_it_cannot_run_names_why():
    """impl="cpp" on experts the kernel does not take (biases, another activation) is refused by name,
    not left to fail as an unknown custom call."""
    e, d, f = 4, 8, 6
    x, ids, weights = jnp.ones((3, d)), jnp.zeros((3, 2), jnp.int32), jnp.ones((3, 2))
    w_gu, w_d = jnp.ones((e, d, 2 * f)), jnp.ones((e, f, d))
    with pytest.raises(ValueError, match="SiLU experts without biases"):
        experts(x, ids, weights, w_gu, w_d, jnp.zeros((e, 2 * f)), jnp.zeros((e, d)), impl="cpp")
    with pytest.raises(ValueError, match="impl='cpp'"):
        experts(x, ids, weights, w_gu, w_d, activation="swiglu_oai", impl="cpp")


def dot_operand_sizes(hlo: str, scope: str) -> list[list[int]]:
    """Element counts of the operands of every dot traced under the named scope `scope` in an HLO
    module's text (operand shapes are looked up among the instructions of the dot's computation)."""
    import re

    sizes, shapes = [], {}
    for line in hlo.splitlines():
        if line and not line.startswith(" "):  # a new computation
            shapes = {}
        m = re.match(r"\s*(?:ROOT )?(%[\w.\-]+) = [a-z0-9]+\[([0-9,]*)\]", line)
        if m:
            shapes[m.group(1)] = int(np.prod([int(v) for v in m.group(2).split(",") if v]))
        if " dot(" in line and f"/{scope}/" in line:
            operands = re.findall(r"%[\w.\-]+", line.split(" dot(", 1)[1].split(")", 1)[0])
            sizes.append([shapes[o] for o in operands if o in shapes])
    return sizes


def test_the_engines_decode_program_multiplies_only_routed_experts(tiny_checkpoints):
    """The compiled decode program of the paged engine: no dot reads all of a layer's experts (what
    a dense all-experts product, or XLA:CPU's lowering of ragged_dot, would do); dots of one expert's
    weights are there."""
    from vsurge import EngineConfig, vSurge

    folder, _ = tiny_checkpoints["qwen3_moe"]
    model, processor = vsurge.load(folder, dtype=jnp.float32, progress=False)
    c = model.config
    config = EngineConfig(max_slots=4, max_length=64, prefill_tokens=16, chunk_lengths=(16,), row_buckets=(4,),
                          window_buckets=(4,), prefill_first=True, page_size=16, num_pages=16, decode_steps=2)
    engine = vSurge.create_odriver(model, processor, config=config).driver.engines[0]
    key = next(job for job in engine.buckets() if job[0] == "decode")
    hlo = engine._build(key).as_text()
    expert_gate_up, all_experts = c.hidden_size * 2 * c.moe_intermediate_size, c.num_experts * c.hidden_size * \
        2 * c.moe_intermediate_size
    sizes = [s for operands in dot_operand_sizes(hlo, "moe") for s in operands]
    from vsurge import kernels

    if kernels.available():  # the C++ kernel reads each routed expert in its stack: no dot at all
        assert kernels.MOE_TARGET in hlo and not sizes
        return
    assert expert_gate_up in sizes  # one expert's gate/up matrix feeds a dot
    assert max(sizes) < all_experts / 2, max(sizes)  # nothing near every expert at once


def test_bfloat16_experts_are_converted_one_at_a_time(tiny_checkpoints):
    """bfloat16 expert stacks are held as raw bits and bit-cast per expert after slicing: XLA:CPU
    converted a whole bfloat16 stack to float32 outside the loop (25 ms per expert at 64 x 1024 x
    768), which a program over bfloat16 arrays still does. Logits stay within bfloat16's error."""
    from flax import nnx

    folder, _ = tiny_checkpoints["qwen3_moe"]
    model, _ = vsurge.load(folder, dtype=jnp.bfloat16, progress=False)
    reference, _ = vsurge.load(folder, dtype=jnp.float32, progress=False)
    assert model.layers[0].experts_gate_up[...].dtype == jnp.uint16
    c = model.config
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, ids: nnx.merge(graphdef, state)(ids)[0])
    ids = jnp.asarray([np.random.default_rng(2).integers(0, 49152, 9)], jnp.int32)
    whole = f"f32[{c.num_experts},{c.hidden_size},{2 * c.moe_intermediate_size}]"
    assert whole not in forward.lower(state, ids).compile().as_text()
    got, want = np.asarray(forward(state, ids)), np.asarray(reference(ids)[0])
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max() + 1e-2
