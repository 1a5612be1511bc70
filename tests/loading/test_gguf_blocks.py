"""GGUF weights kept in their block formats (loading/gguf_blocks.py) against the same file dequantized.

A tiny Llama GGUF holds every format the kernel multiplies (q/k/v in three formats, so the fused
q/k/v is a QuantizedParts; gate and up in one, so a single block matrix), and the default model
(Q4_1 + a Q8_0 tied embedding). The blocks must be exactly the dequantized load's weights; the
logits differ only by the kernel's rounding of activations (8 bits per 32-element block, as
llama.cpp's Q8 activations, plus a second pass over what that rounding left out for models below
~1B parameters: ops/quantized.py's activation_passes), measured here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import vsurge
from gguf_files import Q, write_gguf
from test_gguf_loading import tiny_torch_model
from xla_flags import xla_flags
from vsurge import kernels
from vsurge.hardware import devices
from vsurge.ops.quantized import QuantizedParts, QuantizedWeight, dequantize, is_quantized

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"no block kernel: {kernels.unavailable_reason()}")

EVERY_FORMAT = {
    "token_embd.weight": Q.Q5_K,  # the embedding: rows gathered from blocks
    "output.weight": Q.Q6_K,
    "attn_q.weight": Q.Q8_0,
    "attn_k.weight": Q.Q4_0,
    "attn_v.weight": Q.Q5_1,
    "attn_output.weight": Q.Q4_1,
    "ffn_gate.weight": Q.Q5_0,
    "ffn_up.weight": Q.Q5_0,
    "ffn_down.weight": Q.Q4_K,
}
# Relative to the largest logit. Two-pass activations (~15 bits): measured 1.8e-4 on the default
# model (30 layers, logits up to ~30); with one pass (activation_passes=1, llama.cpp's
# rounding) it was 6.1e-2, and 1.2e-2 on the tiny random model.
TINY_LOGIT_RTOL = 2e-3
DEFAULT_LOGIT_RTOL = 1e-3


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, default_gguf_path):
    path = tmp_path_factory.mktemp("blocks") / "tiny-llama-every-format.gguf"
    write_gguf(path, tiny_torch_model("LlamaConfig"), "llama", EVERY_FORMAT, default_gguf_path)
    blocks, processor = vsurge.load(path, progress=False)
    floats, _ = vsurge.load(path, dtype=jnp.float32, progress=False, load_processor=False)
    return path, blocks, floats, processor


def test_every_format_is_held_as_the_files_blocks(tiny_gguf):
    _, blocks, floats, _ = tiny_gguf
    held = {n: w for n, w in blocks.named_weights().items() if is_quantized(w)}
    layer = blocks.layers[0]
    assert isinstance(layer.wqkv[...], QuantizedParts)  # q8_0 + q4_0 + q5_1 rows
    assert sorted(p.format for p in layer.wqkv[...].parts) == ["q4_0", "q5_1", "q8_0"]
    assert isinstance(layer.w_gate_up[...], QuantizedWeight) and layer.w_gate_up[...].format == "q5_0"
    formats = {f for w in held.values() for f in w.format.split("+")}
    assert formats == {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"}
    float_weights = floats.named_weights()
    for name, w in held.items():  # the same numbers as the dequantized load, row for row
        if name.startswith("layers.") and not name.startswith("layers.0."):
            continue  # layer 1 holds the same formats and shapes
        ref = np.asarray(float_weights[name])
        ours = np.asarray(jax.jit(dequantize)(w))  # (N, K)
        np.testing.assert_allclose(ours if name == "embed" else ours.T, ref,
                                   rtol=1e-6, atol=1e-7, err_msg=name)
    assert blocks.weight_bytes < floats.weight_bytes / 3


def test_tiny_logits_and_the_engines_step_calls_the_kernel(tiny_gguf):
    _, blocks, floats, processor = tiny_gguf
    ids = processor.encode("Blocks kept as they are: 12 ducks swim.")
    ours, ref = jitted_logits(blocks, ids), jitted_logits(floats, ids)
    rel = np.abs(ours - ref).max() / np.abs(ref).max()
    assert rel <= TINY_LOGIT_RTOL, rel
    assert (ours.argmax(-1) == ref.argmax(-1)).all(), (ours.argmax(-1), ref.argmax(-1))

    from vsurge import EngineConfig, vSurge
    from vsurge.kv.paged import half_pages_on_cpu, page_bytes
    from vsurge.server.stats import memory_fields

    config = EngineConfig(max_slots=2, max_length=64, prefill_tokens=16, chunk_lengths=(16,), row_buckets=(2,),
                          window_buckets=(4,), prefill_first=True, page_size=16, num_pages=8, decode_steps=1)
    surge = vSurge.create_odriver(blocks, processor, config=config)
    engine = surge.driver.engines[0]
    memory = memory_fields(surge)  # what /v1/stats reports
    # float16 pages by default where the C++ kernels serve them (kv/paged.pool_dtype), as llama.cpp's cache
    assert engine.kv_dtype == (jnp.float16 if half_pages_on_cpu(blocks) else blocks.dtype)
    per_page = page_bytes(blocks.config.kv_layout, 16, engine.kv_dtype)
    assert memory == {"weight_bytes": blocks.weight_bytes, "kv_cache_bytes": 8 * per_page, "kv_cache_pages": 8,
                      "state_cache_bytes": 0}
    key = next(job for job in engine.buckets() if job[0] == "decode")
    hlo = engine._build(key).as_text()
    # per layer: q, k, v parts + wo + gate_up + down, on the step's real rows only; and the head
    calls = hlo.count('custom_call_target="vsurge_qmatmul_real_rows"')
    assert calls >= blocks.config.num_layers * 6, calls
    assert hlo.count('custom_call_target="vsurge_qmatmul"') >= 1



def test_activation_passes_by_model_size_and_by_choice(tiny_gguf):
    """Two passes below ~1B parameters (the tiny model), one from hidden size 1024 up; `activation_passes=1`
    gives llama.cpp's arithmetic: logits further from float32's than two passes, within its rounding."""
    from vsurge.ops.quantized import ONE_PASS_FROM_HIDDEN, activation_passes

    path, blocks, floats, processor = tiny_gguf
    assert blocks.activation_passes == 2 and floats.activation_passes is None
    assert activation_passes(blocks.config) == 2
    assert activation_passes(blocks.config.replace(hidden_size=ONE_PASS_FROM_HIDDEN)) == 1
    one, _ = vsurge.load(path, progress=False, load_processor=False, activation_passes=1)
    assert one.activation_passes == 1
    assert all(w.passes == 1 for w in jax.tree.leaves(one.layers[0].wqkv[...], is_leaf=is_quantized)
               for w in getattr(w, "parts", (w,)))
    ids = processor.encode("Blocks kept as they are: 12 ducks swim.")
    ref = jitted_logits(floats, ids)
    error = {n: np.abs(jitted_logits(m, ids) - ref).max() / np.abs(ref).max() for n, m in ((1, one), (2, blocks))}
    assert error[2] < error[1] < 5e-2, error
    with pytest.raises(ValueError, match="activation_passes must be 1 or 2"):
        vsurge.load(path, progress=False, load_processor=False, activation_passes=3)


def test_a_lone_decode_row_runs_alone_where_the_kernel_multiplies(tiny_gguf):
    """Block weights get a one-row decode program (a padding row would cost the kernel a row's
    work); float weights keep two rows as the smallest (a one-row float dot runs as two anyway).
    The lone row's tokens are the padded program's: the kernel's rows do not see each other."""
    import asyncio

    from vsurge import EngineConfig, SamplingParams, vSurge

    _, blocks, floats, processor = tiny_gguf
    common = dict(max_slots=2, max_length=64, prefill_tokens=16, chunk_lengths=(16,), window_buckets=(4,),
                  page_size=16, num_pages=8, decode_steps=2)
    alone = vSurge.create_odriver(blocks, processor, config=EngineConfig(**common))
    assert alone.driver.engines[0].config.decode_rows == [1, 2]
    float_engine = vSurge.create_odriver(floats, processor, config=EngineConfig(**common)).driver.engines[0]
    assert float_engine.config.decode_rows == [2]
    # the ladders at 32 slots: every power of 4 where the kernel skips padding rows, of 2 otherwise
    assert EngineConfig(max_slots=32, one_row_decode=True).decode_rows == [1, 4, 16, 32]
    assert EngineConfig(max_slots=32).decode_rows == [2, 4, 8, 16, 32]
    padded = vSurge.create_odriver(blocks, processor, config=EngineConfig(**common, row_buckets=(2,)))
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    tokens = {}
    for name, surge in {"alone": alone, "padded": padded}.items():
        surge.compile()
        surge.start()
        try:
            tokens[name] = [r.token_ids for r in asyncio.run(surge.generate(["Ducks swim in"], params))]
        finally:
            surge.stop(5)
    assert len(tokens["alone"][0]) == 12 and tokens["alone"] == tokens["padded"]

PARIS = ("The capital of France is Paris. It is known for the Eiffel Tower, which was built in 1889 for the "
         "World's Fair. Paris is also home to the Louvre, the most visited museum in the world, where the Mona Lisa "
         "hangs. The river Seine flows through the city, and its banks are lined with bookstalls. Every year, "
         "millions of tourists visit the city to enjoy its food, its art and its history.")


def mean_nll(logits_: np.ndarray, ids: list[int]) -> float:
    """Mean negative log-likelihood of ids[1:] under logits (T, V) of ids."""
    z = logits_ - logits_.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-logp[np.arange(len(ids) - 1), ids[1:]].mean())


def test_default_model_kept_in_blocks(default_model, default_gguf_path):
    """Measured (129 tokens of chat + text): logits 1.8e-4 of the largest apart, the same argmax at
    every position, mean NLL 2.55210 vs 2.55206. With one pass (llama.cpp's rounding): 6.1e-2, 95%
    of positions, NLL 2.559 (+0.7% perplexity), and the greedy answer to "What is the capital of
    France?" parted from float32's at its first token (a 0.08 logit tie)."""
    blocks, processor = vsurge.load("default", progress=False)
    floats, _ = default_model
    assert blocks.block_formats() == {"q4_1": 120, "q8_0": 1}  # 30 layers x 4 matrices + the tied embedding
    file_bytes = default_gguf_path.stat().st_size
    assert 0.9 * file_bytes <= blocks.weight_bytes <= file_bytes, (blocks.weight_bytes, file_bytes)

    ids = processor.apply_chat_template([{"role": "user", "content": "Tell me about Paris."}]) + \
        processor.encode(PARIS)
    ours, ref = jitted_logits(blocks, ids), jitted_logits(floats, ids)
    rel = np.abs(ours - ref).max() / np.abs(ref).max()
    assert rel <= DEFAULT_LOGIT_RTOL, rel
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() >= 0.99
    assert abs(mean_nll(ours, ids) / mean_nll(ref, ids) - 1) <= 1e-3  # perplexity within 0.1%


def jitted_logits(model, ids):
    graphdef, state = nnx.split(model)  # weights as arguments: XLA would constant-fold closed-over ones
    return np.asarray(jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0][0])(state, jnp.asarray([ids], jnp.int32)))


def test_explicit_dtype_dequantizes_and_blocks_is_an_error_off_gguf(tiny_gguf, tmp_path, default_processor_dir):
    from tiny_models import write_tiny_model

    _, _, floats, _ = tiny_gguf
    assert floats.quantization is None and not floats.block_formats()
    folder = tmp_path / "hf"
    folder.mkdir()
    write_tiny_model("llama", folder, default_processor_dir)
    with pytest.raises(ValueError, match="GGUF"):
        vsurge.load(folder, quantization="blocks", progress=False, load_processor=False)


def test_default_weight_dtype_follows_the_cpu(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", xla_flags("--xla_cpu_max_isa=AVX2"))
    assert devices.default_dtype() == jnp.float32  # no native bfloat16 dots for XLA then
    monkeypatch.delenv("XLA_FLAGS")
    native = kernels.cpu_isa() in devices.NATIVE_BF16_ISAS
    assert devices.default_dtype() == (jnp.bfloat16 if native or jax.default_backend() != "cpu" else jnp.float32)


@pytest.mark.parametrize("kind,fmt", [("int4", Q.Q4_0), ("q8_0", Q.Q8_0)])
def test_hf_checkpoint_quantized_at_load_to_blocks(kind, fmt, tmp_path, default_processor_dir):
    """An HF checkpoint with --quantization int4 / q8_0: every matrix and the embedding held as gguf's
    quantizer writes them; logits those of a float model holding gguf's dequantized weights (the
    independent reference) within the activations' 8-bit rounding."""
    import gguf

    from tiny_models import write_tiny_model
    from vsurge.hardware.sharding import _holder_param

    write_tiny_model("llama", tmp_path, default_processor_dir)
    floats, processor = vsurge.load(tmp_path, dtype=jnp.float32, progress=False)
    blocks, _ = vsurge.load(tmp_path, dtype=jnp.float32, quantization=kind, progress=False, load_processor=False)
    assert blocks.quantization == "blocks"
    held = {n: w for n, w in blocks.named_weights().items() if is_quantized(w)}
    assert set(held) == {n for n, spec in floats.weight_specs(floats.config).items()
                         if len(spec.shape) == 2 and (spec.quantize or spec.lookup)}
    assert {w.format for w in held.values()} == {fmt.name.lower()}
    for name, w in held.items():
        ref = np.asarray(floats.named_weights()[name])
        rows = ref if name == "embed" else ref.T
        expected = gguf.quants.dequantize(gguf.quants.quantize(rows, fmt), fmt)
        np.testing.assert_allclose(np.asarray(dequantize(w)), expected, rtol=1e-6, atol=1e-7, err_msg=name)
        _holder_param(floats, name).set_value(jnp.asarray(expected if name == "embed" else expected.T))
    ids = processor.encode("Quantized at load: 12 ducks swim.")
    ours, ref = jitted_logits(blocks, ids), jitted_logits(floats, ids)
    rel = np.abs(ours - ref).max() / np.abs(ref).max()
    assert rel <= TINY_LOGIT_RTOL, rel


def grouped_reference(rows: np.ndarray, fmt: str, group: int) -> np.ndarray:
    """W (N, K) quantized with one scale per `group` weights by llama.cpp's q8_0 / q4_0 rounding, dequantized
    (float32 x times the scale's inverse, as llama.cpp computes it)."""
    groups = rows.reshape(rows.shape[0], -1, group).astype(np.float32)
    if fmt == "q8_0":
        scale = np.abs(groups).max(-1, keepdims=True) / np.float32(127)
        out = np.round(groups * (np.float32(1) / scale)) * scale
    else:
        scale = np.take_along_axis(groups, np.abs(groups).argmax(-1)[..., None], -1) / np.float32(-8)
        out = (np.minimum(15, np.floor(groups * (np.float32(1) / scale) + np.float32(8.5))) - 8) * scale
    return out.reshape(rows.shape)


@pytest.mark.parametrize("kind", ["int4_g64", "int4_g128", "int8_g128"])
def test_hf_checkpoint_quantized_with_larger_groups(kind, tmp_path, default_processor_dir):
    """One scale per 64 / 128 weights: every 32-weight block of a group holds the group's scale and
    the codes are llama.cpp's rounding with it (a numpy reference); the logits are those of a float
    model holding the reference's weights, within the activations' rounding."""
    from tiny_models import write_tiny_model
    from vsurge.config import BLOCK_QUANTIZATIONS
    from vsurge.hardware.sharding import _holder_param

    fmt, group = BLOCK_QUANTIZATIONS[kind]
    write_tiny_model("llama", tmp_path, default_processor_dir)
    floats, processor = vsurge.load(tmp_path, dtype=jnp.float32, progress=False)
    blocks, _ = vsurge.load(tmp_path, dtype=jnp.float32, quantization=kind, progress=False, load_processor=False)
    assert set(blocks.block_formats()) == {fmt}
    for name, w in blocks.named_weights().items():
        if not is_quantized(w):
            continue
        ref = np.asarray(floats.named_weights()[name])
        rows = ref if name == "embed" else ref.T
        size = group if rows.shape[1] % group == 0 else 64  # hidden 64: those matrices take groups of 64
        expected = grouped_reference(rows, fmt, size)
        got = np.asarray(dequantize(w))
        np.testing.assert_allclose(got, expected, rtol=2e-3, atol=1e-3 * np.abs(expected).max(), err_msg=name)
        _holder_param(floats, name).set_value(jnp.asarray(expected if name == "embed" else expected.T))
    ids = processor.encode("Groups of weights share a scale: 12 ducks swim.")
    ours, ref = jitted_logits(blocks, ids), jitted_logits(floats, ids)
    rel = np.abs(ours - ref).max() / np.abs(ref).max()
    assert rel <= TINY_LOGIT_RTOL, rel
    assert blocks.weight_bytes < floats.weight_bytes / (3 if fmt == "q4_0" else 1.8)


def test_group_size_that_does_not_divide_is_refused():
    from vsurge.ops.quantized import quantize

    with pytest.raises(ValueError, match="group size 128"):
        quantize(np.ones((16, 96), np.float32), "q4_0", 128)
    with pytest.raises(ValueError, match="q8_0 and q4_0"):
        quantize(np.ones((16, 128), np.float32), "q4_1", 64)
