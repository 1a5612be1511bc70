"""Quantized KV pages (`--kv-cache-dtype int8 | fp8`, kv/quant.py): the quantization against a numpy
reference, logits against the float KV cache on tiny models (paged and dense caches; bfloat16 pages of
a float32 model too), greedy text on
the default model, the engine's prefix cache / preemption / host tier / speculation under int8, pool
sizing and the start-up line, and bad input."""

from __future__ import annotations

import asyncio
from functools import partial

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

import vsurge
from vsurge import EngineConfig, SamplingParams, vSurge
from vsurge.kv import quant
from vsurge.kv.dense import DenseKVCache
from vsurge.kv.paged import PagedAttentionCache, StepLayout, page_bytes


# ------------------------------------------------------------------ quantization vs numpy
def numpy_quantize(x: np.ndarray, dtype, qmax: float):
    """Reference: per-row absmax / qmax scale in float16, values x / scale (int8: rounded half to even)."""
    scale = (np.abs(x).max(axis=-1) / qmax).astype(np.float16)
    safe = np.where(scale > 0, scale.astype(np.float32), 1.0)[..., None]
    q = np.clip(x / safe, -qmax, qmax)
    return (np.round(q).astype(np.int8) if dtype == "int8" else q.astype(ml_dtypes.float8_e4m3fn)), scale


@pytest.mark.parametrize("name,qmax", [("int8", 127.0), ("fp8", 448.0)])
def test_quantize_matches_numpy_and_round_trips_within_half_a_step(name, qmax):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 4, 64)).astype(np.float32) * np.array([1e-3, 0.5, 3.0, 40.0, 1.0, 7.0])[:, None, None]
    x[1, 2] = 0.0  # an all-zero vector (padding) stores zeros, no NaN
    x[2, 1, 5] = 300.0  # an outlier channel sets its row's scale
    dtype = quant.storage_dtype(name, jnp.float32)
    packed = np.asarray(quant.quantize(jnp.asarray(x), dtype))
    assert packed.shape == (6, 4, 66) and packed.dtype == dtype
    want_q, want_scale = numpy_quantize(x, name, qmax)
    assert np.array_equal(packed[..., :64].view(np.uint8), want_q.view(np.uint8))
    assert np.array_equal(packed[..., 64:].copy().view(np.float16)[..., 0], want_scale)
    back = np.asarray(quant.dequantize(jnp.asarray(packed), jnp.float32))
    assert np.array_equal(back[1, 2], np.zeros(64))
    step = want_scale.astype(np.float32)[..., None]  # one int8 step; fp8: the spacing at absmax (2**-3 of it)
    bound = step / 2 if name == "int8" else np.abs(x).max(-1, keepdims=True) * 2.0**-4
    assert np.all(np.abs(back - x) <= bound * 1.001 + 1e-12)


def test_page_arrays_carry_the_scales_and_pages_per_gib_double():
    from vsurge.config import KVLayer

    layers = (KVLayer(heads=3, k_dim=64, v_dim=64),) * 2
    cache = PagedAttentionCache.init(layers, 5, 16, jnp.int8)
    assert cache.k[0].shape == (5, 3, 66, 16) and cache.v[0].shape == (5, 3, 16, 66)
    assert (cache.num_pages, cache.page_size) == (5, 16)
    int8, bf16, f32 = (page_bytes(layers, 16, d) for d in (jnp.int8, jnp.bfloat16, jnp.float32))
    assert int8 == sum(a.nbytes for a in (*cache.k, *cache.v)) // 5  # what the pool really allocates
    assert int8 == 16 * 2 * 3 * 2 * 66  # (dk + 2 scale bytes) per token, head, side and layer
    assert bf16 / int8 == 128 / 66 > 1.93 and f32 / int8 > 3.87  # head_dim 64: 2x bf16 less the scales


# ------------------------------------------------------------------ logits vs the float cache
def load_tiny(tiny_checkpoints, name):
    return vsurge.load(tiny_checkpoints[name][0], dtype=jnp.float32, progress=False)


def forward(model, ids, positions, cache):
    """The model's pass over one step, op by op (compiling each step's program costs more here)."""
    logits, cache = model(ids, positions, cache)
    return logits[0, -1], cache


def paged_logits(model, ids, forced, dtype, page_size=4):
    """Logits of a prompt (one chunk row) then one decode row per forced token, the paged cache stored
    in `dtype`: (1 + len(forced), V). The prompt spans several pages, decode reads every column."""
    n, pages = len(ids), -(-(len(ids) + len(forced)) // page_size)
    cache = PagedAttentionCache.init(model.config.kv_layout, pages, page_size, dtype)
    table = jnp.arange(pages, dtype=jnp.int32)[None]
    none = jnp.zeros((0, pages), jnp.int32)
    prompt = StepLayout(jnp.arange(n, dtype=jnp.int32), none, jnp.zeros((0, 1), jnp.int32), table,
                        jnp.arange(n, dtype=jnp.int32)[None])
    logits, cache = forward(model, jnp.asarray([ids]), jnp.arange(n)[None], cache.for_step(prompt))
    out = [logits]
    for pos, token in enumerate(forced, start=n):
        step = StepLayout(jnp.asarray([pos], jnp.int32), table, jnp.asarray([[pos]], jnp.int32), none,
                          jnp.zeros((0, 1), jnp.int32))
        logits, cache = forward(model, jnp.asarray([[token]]), jnp.asarray([[pos]]),
                                cache.storage_only().for_step(step))
        out.append(logits)
    return np.asarray(jnp.stack(out))


def dense_logits(model, ids, forced, dtype):
    cache = DenseKVCache.init(model.config.kv_layout, 1, len(ids) + len(forced), dtype).with_mode(True)
    logits, cache = forward(model, jnp.asarray([ids]), jnp.arange(len(ids))[None], cache)
    out, cache = [logits], cache.with_mode(False)
    for pos, token in enumerate(forced, start=len(ids)):
        logits, cache = forward(model, jnp.asarray([[token]]), jnp.asarray([[pos]]), cache)
        out.append(logits)
    return np.asarray(jnp.stack(out))


# llama (MHA 4 heads), qwen3 (GQA, head_dim 24), gemma2 (soft-caps, sliding window of 4 < the prompt)
@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma2"])
def test_int8_logits_stay_within_tolerance_of_the_float_cache(name, tiny_checkpoints):
    model, processor = load_tiny(tiny_checkpoints, name)
    ids = processor.encode("The ducks of the river ran past the old mill, one two three")
    forced = list(np.random.default_rng(1).integers(0, model.config.vocab_size, 4))  # teacher-forced decode
    reference = paged_logits(model, ids, forced, jnp.float32)
    spread = reference.max() - reference.min()
    checks = [(paged_logits(model, ids, forced, jnp.int8), reference, 0.02)]
    if name == "llama":  # fp8, bfloat16 pages and the dense cache on one family (each check costs seconds)
        checks += [(paged_logits(model, ids, forced, jnp.float8_e4m3fn), reference, 0.08),
                   (paged_logits(model, ids, forced, jnp.bfloat16), reference, 0.01),
                   (dense_logits(model, ids, forced, jnp.int8), dense_logits(model, ids, forced, jnp.float32), 0.02)]
    for got, want, tol in checks:
        err = np.abs(got - want).max()
        assert 0 < err <= tol * spread, (err, spread)  # quantized (not equal), and close


QUESTIONS = ["What is 12 times 7? Explain step by step.", "Explain in one sentence why the sky is blue."]


def test_default_model_greedy_text_matches_the_float_cache_for_the_first_tokens(default_model):
    """48 greedy tokens of two chat questions with the float cache, teacher-forced through an int8
    cache: the int8 cache predicts the same next token at (nearly) every position, and at every one
    of the first tokens. (Free-running texts fork at the first near-tie, and where depends on the
    CPU's summation order, so they are compared position by position instead.)"""
    model, processor = default_model
    graphdef, state = nnx.split(model)
    agree, first = [], []
    for question in QUESTIONS:
        ids = processor.encode(processor.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                             add_generation_prompt=True))
        greedy = token_by_token(graphdef, state, model.config, ids, 47, jnp.float32)[len(ids) - 1:]  # 48
        forced = token_by_token(graphdef, state, model.config, ids + greedy[:-1], 0, jnp.int8)[len(ids) - 1:]
        same = np.asarray(forced) == np.asarray(greedy)  # (48,): the int8 cache's next token at each position
        agree.append(same.mean())
        first.append(int(np.argmin(same)) if not same.all() else len(same))
    assert min(first) >= 4 and np.mean(agree) >= 0.9, (first, agree)


@partial(jax.jit, static_argnums=0, donate_argnames="cache")
def _one_token(graphdef, state, token, position, cache):
    logits, cache = nnx.merge(graphdef, state)(token, position, cache)
    return jnp.argmax(logits[0, -1]), cache


def token_by_token(graphdef, state, config, ids, steps, dtype, length=192):
    """Feeds `ids` one token a step through a dense cache stored in `dtype` (one compiled program for
    every prompt), then its own argmax `steps` more times: the argmax after every fed token."""
    cache, out = DenseKVCache.init(config.kv_layout, 1, length, dtype), []
    for pos in range(len(ids) + steps):
        token = ids[pos] if pos < len(ids) else out[-1]
        nxt, cache = _one_token(graphdef, state, jnp.asarray([[token]]), jnp.asarray([[pos]]), cache)
        out.append(int(nxt))
    return out


# ------------------------------------------------------------------ the engine under int8
TEXT = "one two three four five six seven eight nine ten one two three four five six seven eight"
PROMPTS = [TEXT, TEXT + " nine ten one two", "The ducks of the river ran past the old mill and the ducks of the"]
CONFIG = dict(max_slots=4, max_length=64, prefill_tokens=16, chunk_lengths=(16,), row_buckets=(4,),
              window_buckets=(4,), prefill_first=True, page_size=16, decode_steps=4, kv_cache_dtype="int8")


def run(surge, prompts, params):
    surge.compile()
    surge.start()
    try:
        return [r.token_ids for r in asyncio.run(surge.generate(prompts, params))]
    finally:
        surge.stop(5)


def test_prefix_hits_preemption_host_tier_and_speculation_keep_the_int8_tokens(tiny_checkpoints):
    model, processor = load_tiny(tiny_checkpoints, "llama")
    plain = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    spec = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, speculative_tokens=3)
    roomy = vSurge.create_odriver(model, processor, config=EngineConfig(**CONFIG, num_pages=16,
                                                                        enable_prefix_caching=False))
    want = run(roomy, PROMPTS, plain)
    # 7 pages for 3 sequences of up to 3 pages: preemption; the host tier keeps the swapped pages
    tight = vSurge.create_odriver(model, processor, config=EngineConfig(**CONFIG, num_pages=7,
                                                                        kv_host_cache_bytes=1 << 20))
    engine = tight.driver.engines[0]
    assert engine.kv_dtype == jnp.int8 and engine.init_state().kv.v[0].dtype == jnp.int8
    tight.compile()
    tight.start()
    try:
        first = [r.token_ids for r in asyncio.run(tight.generate(PROMPTS[:1], plain))]
        again = [r.token_ids for r in asyncio.run(tight.generate(PROMPTS, spec))]
    finally:
        tight.stop(5)
    assert first == want[:1] and again == want
    assert tight.metrics.value("vsurge:prefix_cache_hits_total") > 0
    assert tight.metrics.value("vsurge:num_preemptions_total") > 0


def test_disk_tier_fingerprint_and_prefix_signature_name_the_kv_dtype(tiny_checkpoints, tmp_path):
    from vsurge.engine.tier_mover import fingerprint, make_host_tier
    from vsurge.kv.backends.tpu import kernel_layout

    model, _ = load_tiny(tiny_checkpoints, "llama")
    base = EngineConfig(page_size=16, kv_cache_dir=str(tmp_path))
    int8 = base.replace(kv_cache_dtype="int8")
    assert fingerprint(model, base) != fingerprint(model, int8) != fingerprint(model, base.replace(kv_cache_dtype="fp8"))
    # pages of another backend's layout never match either (kv/backends)
    assert fingerprint(model, base.replace(attention_backend="tpu")) != fingerprint(model, base)
    tier = make_host_tier(model, int8)
    layer = model.config.kv_layout[0]
    assert tier.disk.spec[0] == ((layer.heads, layer.k_dim + 2, 16), "int8")
    tier.disk.close()
    tpu = make_host_tier(model, base.replace(attention_backend="tpu", kv_cache_dir=str(tmp_path / "tpu")))
    # the tiny model's 16-lane heads never make the kernel's 128: the tpu layout keeps its pages heads-major
    assert not kernel_layout(layer.heads, layer.k_dim, layer.v_dim, model.dtype)
    assert tpu.disk.spec[0][0] == (layer.heads, 16, layer.k_dim)
    tpu.disk.close()


# ------------------------------------------------------------------ sizing, start-up line, bad input
def test_the_startup_line_prints_the_int8_pool(tiny_checkpoints):
    from vsurge.cli.local_engine import describe_kv_pool
    from vsurge.kv.paged import half_pages_on_cpu, pool_page_bytes

    model, processor = load_tiny(tiny_checkpoints, "llama")
    lines = {}
    for dtype in ("auto", "float32", "bfloat16", "int8"):
        surge = vSurge.create_odriver(model, processor, config=EngineConfig(**{**CONFIG, "kv_cache_dtype": dtype},
                                                                            num_pages=8))
        lines[dtype] = describe_kv_pool(model, surge.driver.engines[0])
    per_page = pool_page_bytes(model, EngineConfig(page_size=16, kv_cache_dtype="int8"))
    assert lines["int8"] == (f"Paged KV cache: 8 pages of 16 tokens (128 tokens, {8 * per_page / 2**20:.1f} MiB, "
                             f"int8 with float16 scales, {2**30 // per_page} pages per GiB); sized as asked "
                             f"(--num-pages); cpu attention backend")
    auto = "float16" if half_pages_on_cpu(model) else "float32"  # kv/paged.pool_dtype
    assert f", {auto}, " in lines["auto"] and ", float32, " in lines["float32"] and ", bfloat16, " in lines["bfloat16"]
    per_gib = {d: int(line.split("; ")[0].split(", ")[-1].split()[0]) for d, line in lines.items()}  # "N pages per GiB)"
    assert per_gib["bfloat16"] in (2 * per_gib["float32"], 2 * per_gib["float32"] + 1)  # half the bytes of float32
    dk = model.config.kv_layout[0].k_dim  # int8: dk + 2 bytes per token, head and side (the scale's two)
    assert abs(per_gib["int8"] - per_gib["bfloat16"] * 2 * dk / (dk + 2)) <= 2


def test_bad_kv_cache_dtypes_are_refused_by_name():
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of auto, float32, bfloat16, float16, int8, fp8"):
        EngineConfig(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        quant.storage_dtype("int4", jnp.float32)


def test_serve_refuses_an_unknown_kv_cache_dtype():
    from cli_helpers import run_cli

    out = run_cli("serve", "--kv-cache-dtype", "int4", timeout=120)
    assert out.returncode == 2 and "--kv-cache-dtype" in out.stderr and "int4" in out.stderr


def test_jax_handles_the_fp8_converts_on_this_backend():
    """fp8 pages rely on XLA converting float8_e4m3fn exactly (on CPU it emulates them): as ml_dtypes."""
    x = np.random.default_rng(0).normal(size=(4096,)).astype(np.float32) * 50
    got = np.asarray(jax.jit(lambda v: v.astype(jnp.float8_e4m3fn).astype(jnp.float32))(x))
    assert np.array_equal(got, x.astype(ml_dtypes.float8_e4m3fn).astype(np.float32))


def test_vinference_buckets_store_their_pages_as_asked(tiny_checkpoints):
    from vsurge import vInference, vInferenceConfig

    model, processor = load_tiny(tiny_checkpoints, "llama")
    vi = vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=8, kv_cache_dtype="int8"))
    assert vi._buckets.config(2, 16).kv_cache_dtype == "int8"  # every bucket's engine: int8 pages
