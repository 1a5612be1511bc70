"""fp8 weights (`quantization="fp8"`): float8_e4m3fn matrices and head with per-output-channel scales.

The reference is a float32 model holding the fp8 weights' own values (code times scale): the
logits must match it to float rounding, so the only difference from the float model is the
weights' rounding to e4m3, which is measured against the float model too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

import vsurge
from vsurge.ops.linear import FP8, FP8_MAX, quantize_fp8


def logits(model, ids):
    graphdef, state = nnx.split(model)
    return np.asarray(jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0][0])(state, jnp.asarray([ids], jnp.int32)))


def test_quantize_fp8_rounds_each_channel_to_e4m3():
    w = np.random.default_rng(0).normal(size=(96, 40)).astype(np.float32) * np.linspace(0.1, 3, 40)
    q, scale = quantize_fp8(jnp.asarray(w))
    assert q.dtype == FP8 and scale.shape == (40,)
    np.testing.assert_allclose(np.asarray(scale), np.abs(w).max(0) / FP8_MAX, rtol=1e-6)
    expected = (w / np.asarray(scale)).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(q, np.float32), expected)
    assert np.abs(np.asarray(q, np.float32)).max() == FP8_MAX  # each channel's largest weight maps to 448
    rel = np.abs(np.asarray(q, np.float32) * np.asarray(scale) - w).max() / np.abs(w).max()
    assert rel < 1 / 16  # e4m3: 3 mantissa bits


def test_fp8_model_equals_float_model_holding_its_weights(tmp_path, default_processor_dir):
    from tiny_models import write_tiny_model
    from vsurge.hardware.sharding import _holder_param

    write_tiny_model("qwen2", tmp_path, default_processor_dir)
    floats, processor = vsurge.load(tmp_path, dtype=jnp.float32, progress=False)
    original, _ = vsurge.load(tmp_path, dtype=jnp.float32, progress=False, load_processor=False)
    fp8, _ = vsurge.load(tmp_path, dtype=jnp.float32, quantization="fp8", progress=False, load_processor=False)
    assert fp8.quantization == "fp8"
    quantized = {n: w for n, w in fp8.named_weights().items() if getattr(w, "dtype", None) == FP8}
    assert "lm_head" in quantized and any("wqkv" in n for n in quantized)
    weights = fp8.named_weights()
    for name, w in quantized.items():  # the float model holds the fp8 weights' values
        _holder_param(floats, name).set_value(jnp.asarray(w, jnp.float32) * weights[name + "_scale"][None, :])
    assert fp8.weight_bytes < 0.4 * floats.weight_bytes + 4 * floats.embed[...].size  # ~1 byte per matrix weight
    ids = processor.encode("Eight bits of float: 12 ducks swim.")
    ours, ref = logits(fp8, ids), logits(floats, ids)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    rounding = np.abs(ours - logits(original, ids)).max() / np.abs(ref).max()
    assert 0 < rounding < 0.2, rounding  # e4m3's own rounding, measured against the float model


def test_fp8_refuses_a_second_quantization(tmp_path, default_processor_dir):
    from tiny_models import write_tiny_model

    write_tiny_model("llama", tmp_path, default_processor_dir)
    model, _ = vsurge.load(tmp_path, dtype=jnp.float32, quantization="fp8", progress=False, load_processor=False)
    with pytest.raises(ValueError, match="quantized already"):
        model.quantize("int8")
    assert model.quantize("fp8") is model


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_the_accelerators_converted_dot_is_the_float_product_of_the_quantized_weight(kind):
    """int8 weights on a TPU/GPU (and fp8 everywhere) multiply through converted_dot; run here on CPU against the
    float product of the dequantized weight, in bfloat16 activations as on the chip."""
    from vsurge.ops.linear import converted_dot, quantize_int8

    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(0, 0.05, (96, 40)), jnp.float32)
    q, scale = (quantize_int8 if kind == "int8" else quantize_fp8)(w)
    x = jnp.asarray(rng.normal(0, 1, (3, 5, 96)), jnp.bfloat16)
    got = converted_dot(x, q, scale)
    assert got.shape == (3, 5, 40) and got.dtype == jnp.bfloat16
    want = x.astype(jnp.float32) @ (q.astype(jnp.float32) * scale)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2, atol=2e-2)
    assert float(jnp.abs(want - x.astype(jnp.float32) @ w).max()) < 0.1  # and that is near the float weight's
