"""int8 weight quantization: close to float32, same greedy answer on the default model."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import vsurge
from conftest import CHAT_PROMPT
from vsurge.config import ModelConfig
from reference_generation import greedy_reference
from vsurge.ops.linear import linear, quantize_int8


def test_int8_linear_matches_float_within_quantization_error():
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.05, (96, 40)).astype(np.float32)
    q, scale = quantize_int8(jnp.asarray(w))
    dequantized = np.asarray(q, np.float32) * np.asarray(scale)[None]
    assert np.abs(dequantized - w).max() <= np.abs(w).max(0).max() / 254 + 1e-7  # half a step
    for rows in (1, 3, 200):  # the int8 dot path and the dequantize path
        x = rng.normal(0, 1, (rows, 96)).astype(np.float32)
        x[:, 5] *= 50  # an outlier channel, as real activations have
        got = np.asarray(linear(jnp.asarray(x), q, scale))
        np.testing.assert_allclose(got, x @ dequantized, rtol=1e-3, atol=1e-3 * np.abs(x @ dequantized).max())


def test_quantize_rejects_unknown_kind():
    cfg = ModelConfig(architecture="llama", vocab_size=50, hidden_size=16, intermediate_size=32, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=8)
    with pytest.raises(ValueError, match="unsupported quantization 'int3'"):
        vsurge.LlamaForCausalLM(cfg, rngs=nnx.Rngs(0)).quantize("int3")
    with pytest.raises(ValueError, match="unsupported quantization"):
        vsurge.load("default", quantization="fp4")


@pytest.fixture(scope="module")
def int8_model():
    return vsurge.load("default", dtype=jnp.float32, quantization="int8", progress=False)


def test_int8_default_model_agrees_with_float32(int8_model, default_model):
    model, processor = int8_model
    assert model.quantization == "int8" and model.layers[0].wqkv[...].dtype == jnp.int8
    assert model.decode_bytes < default_model[0].decode_bytes / 3.5
    ids = processor.apply_chat_template(CHAT_PROMPT) + processor.encode(" The capital of France is Paris.")
    ref = np.asarray(default_model[0](jnp.asarray([ids]))[0][0])
    got = np.asarray(model(jnp.asarray([ids]))[0][0])
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
    prompt = processor.apply_chat_template(CHAT_PROMPT)
    answer = greedy_reference(model, prompt, 16, stop_token_ids=processor.eos_token_ids)
    assert processor.decode(answer, skip_special_tokens=True) == "The capital of France is Paris."


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_loading_quantizes_each_matrix_as_it_is_placed(tiny_checkpoints, kind, monkeypatch):
    """load(quantization=...) quantizes every layer matrix as it reaches the device (the float model never exists
    whole there: an 8B checkpoint as int8 on a 16 GB chip), and gives exactly what quantizing the loaded float
    model gives."""
    from vsurge.loading import weights as placing

    from vsurge import loading

    path = tiny_checkpoints["llama"][0]
    model, _ = vsurge.load(path, dtype=jnp.bfloat16, quantization=kind, progress=False, load_processor=False)
    after, _ = vsurge.load(path, dtype=jnp.bfloat16, progress=False, load_processor=False)
    after.quantize(kind)
    assert jax_tree_equal(nnx.state(model, nnx.Param), nnx.state(after, nnx.Param))
    assert model.quantization == kind and model.layers[0].wqkv[...].dtype.itemsize == 1

    # each matrix is quantized right after it is placed, before the next is: one float matrix at a time
    last, quantized = {}, []
    real_put, real_quantizer = placing.jax.device_put, loading.PLACED_QUANTIZERS[kind]

    def put(x, *a, **k):
        last["placed"] = real_put(x, *a, **k)
        return last["placed"]

    def quantizer(w):
        assert w is last.pop("placed")
        quantized.append(w.shape)
        return real_quantizer(w)

    monkeypatch.setattr(placing.jax, "device_put", put)
    monkeypatch.setitem(loading.PLACED_QUANTIZERS, kind, quantizer)
    vsurge.load(path, dtype=jnp.bfloat16, quantization=kind, progress=False, load_processor=False)
    spec = model.layer_weights(model.config, 0)
    assert len(quantized) == model.config.num_layers * sum(1 for w in spec.values() if w.quantize and not w.indexed)


def jax_tree_equal(a, b) -> bool:
    import jax

    leaves_a, tree_a = jax.tree_util.tree_flatten(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b)
    return tree_a == tree_b and all(np.array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))
                                    for x, y in zip(leaves_a, leaves_b))
