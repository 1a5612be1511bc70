"""The quantized matmul (vsurge.ops.quantized + the C++ kernel) against numpy references.

Weights: for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 a random matrix quantized by the `gguf` package's
quantizer; for K-quants random valid blocks (tests/gguf_files.random_blocks). The reference
weights are always `gguf.quants.dequantize` of those bytes. The kernel quantizes activations to
int8 per 32-block (as llama.cpp does), so it is compared two ways: tightly with a numpy emulation
of that quantization (the integer dot products are exact), and loosely with the float product
(the activation rounding alone: ~0.5% relative on Gaussian data, measured and bounded here).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import threading

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gguf_files import random_blocks

from vsurge import kernels
from vsurge.ops.quant_layout import FORMATS, repack_gguf, tile_bytes, tile_count
from vsurge.ops.quantized import (QUANTIZABLE, QuantizedWeight, dequantize, from_gguf, qmatmul, quantize, real_rows,
                                  with_passes)

N, K = 45, 512  # 45 rows: two full tiles and one of 13 (an AVX2 half of 8 and one of 5); K = 2 super-blocks
ROWS = (1, 2, 7, 32, 64, 130)  # 130: three 64-row chunks, the last of 2
ACTIVATION_ERROR = 0.012  # bound on ||kernel - float|| / ||float|| from int8 activations (measured ~0.005)
TWO_PASS_ERROR = 1e-4  # the same with the rounding residual multiplied too

needs_kernel = pytest.mark.skipif(not kernels.available(), reason=f"no kernel: {kernels.unavailable_reason()}")


def gguf_blocks(fmt: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    qtype = FORMATS[fmt].qtype
    if fmt in QUANTIZABLE:
        return gguf.quants.quantize(rng.normal(0, 1, (n, k)).astype(np.float32), qtype)
    return random_blocks(n, k, qtype, rng)


@pytest.fixture(scope="module", params=list(FORMATS))
def case(request):
    """(format, raw GGUF blocks, QuantizedWeight, reference W (N, K) float64)."""
    fmt = request.param
    raw = gguf_blocks(fmt, N, K, seed=FORMATS[fmt].kernel_id)
    w_ref = gguf.quants.dequantize(raw, FORMATS[fmt].qtype).astype(np.float64)
    return fmt, raw, from_gguf(raw, FORMATS[fmt].qtype), w_ref


def int8_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's activation quantization in numpy: per 32-block d = max|x| / 127, q = rint(x / d)
    computed as x * (1 / d) in float32. -> q (M, K / 32, 32) float64, d (M, K / 32) float64."""
    b = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(b).max(axis=-1)
    d = amax / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=amax > 0)
    q = np.rint(b * inv[..., None])
    return q.astype(np.float64), d.astype(np.float64)


def emulated(x: np.ndarray, w_ref: np.ndarray, two_pass: bool = False) -> np.ndarray:
    """The kernel's product in float64 from its activation codes; two passes add the rounding
    residual's codes at d / 256 (kernels/qmatmul.h), held to +-127."""
    q, d = int8_activations(x)
    if two_pass:
        b = x.astype(np.float32).reshape(x.shape[0], -1, 32)
        d32 = d.astype(np.float32)[..., None]
        residual = b - q.astype(np.float32) * d32
        up = np.divide(np.float32(256), d32, out=np.zeros_like(d32), where=d32 > 0)
        q = q + np.clip(np.rint(residual * up), -127, 127) / 256
    return np.einsum("mbk,nbk,mb->mn", q, w_ref.reshape(w_ref.shape[0], -1, 32), d)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_layout_round_trip_is_exact(case):
    fmt, _, w, w_ref = case
    assert w.shape == (N, K) and w.format == fmt
    np.testing.assert_array_equal(np.asarray(jax.jit(dequantize)(w)), w_ref.astype(np.float32))


@needs_kernel
def test_cpp_repack_writes_the_numpy_layout(case):
    fmt, raw, _, _ = case
    f = FORMATS[fmt]
    np.testing.assert_array_equal(kernels.repack(f.kernel_id, raw, N, K, tile_count(N), tile_bytes(f, K)),
                                  repack_gguf(raw, f))


def test_kernel_is_built_where_it_can_be():
    """On x86-64 Linux with g++ the install builds the kernel: a silent fallback would hide it."""
    if platform.machine() != "x86_64" or sys.platform != "linux" or shutil.which("g++") is None:
        pytest.skip("the kernel is only expected on x86-64 Linux with g++")
    if os.environ.get("VSURGE_CPU_ISA", "").lower() in ("none", "off", "xla"):
        pytest.skip("disabled by VSURGE_CPU_ISA")
    assert kernels.available(), kernels.unavailable_reason()


@needs_kernel
@pytest.mark.parametrize("variant", ["avx2", "avx512", "avx512_vnni"])
@pytest.mark.parametrize("two_pass", [False, True])
def test_kernel_matches_the_reference(case, variant, two_pass):
    if variant not in kernels.supported_variants():
        pytest.skip(f"this CPU does not run {variant}")
    fmt, _, w, w_ref = case
    previous = kernels.set_variant(variant)
    try:
        program = jax.jit(lambda x, w: qmatmul(x, w, two_pass=two_pass))
        rng = np.random.default_rng(1)
        for m in ROWS:
            x = rng.normal(0, 1, (m, K)).astype(np.float32)
            x[0, :32] = 0  # an all-zero block has scale 0
            y = np.asarray(program(jnp.asarray(x), w))
            assert y.shape == (m, N) and y.dtype == np.float32
            want = emulated(x, w_ref, two_pass)
            np.testing.assert_allclose(y, want, rtol=0, atol=2e-5 * np.abs(want).max(), err_msg=f"{fmt} M={m}")
            exact = x.astype(np.float64) @ w_ref.T
            assert rel(y, exact) < (TWO_PASS_ERROR if two_pass else ACTIVATION_ERROR), (fmt, m)
    finally:
        kernels.set_variant(previous)


@needs_kernel
def test_bfloat16_activations(case):
    fmt, _, w, w_ref = case
    x = jnp.asarray(np.random.default_rng(2).normal(0, 1, (7, K)), jnp.bfloat16)
    y = np.asarray(jax.jit(qmatmul)(x, w))
    want = emulated(np.asarray(x.astype(jnp.float32)), w_ref)
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_fallback_is_the_float_product(case):
    fmt, _, w, w_ref = case
    x = np.random.default_rng(3).normal(0, 1, (7, K)).astype(np.float32)
    y = np.asarray(jax.jit(lambda x, w: qmatmul(x, w, use_kernel=False))(jnp.asarray(x), w))
    want = x.astype(np.float64) @ w_ref.T
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-5 * np.abs(want).max())


@needs_kernel
def test_kernel_and_fallback_agree_within_the_activation_error(case):
    fmt, _, w, _ = case
    x = jnp.asarray(np.random.default_rng(4).normal(0, 1, (32, K)).astype(np.float32))
    kernel = np.asarray(jax.jit(qmatmul)(x, w))
    fallback = np.asarray(jax.jit(lambda x, w: qmatmul(x, w, use_kernel=False))(x, w))
    error = rel(kernel, fallback)
    assert 0 < error < ACTIVATION_ERROR, (fmt, error)


@needs_kernel
def test_compiled_program_calls_the_kernel():
    w = from_gguf(gguf_blocks("q4_1", N, K), "q4_1")
    x = jnp.zeros((2, K), jnp.float32)
    with_kernel = jax.jit(qmatmul).lower(x, w).compile().as_text()
    assert 'custom_call_target="vsurge_qmatmul"' in with_kernel
    without = jax.jit(lambda x, w: qmatmul(x, w, use_kernel=False)).lower(x, w).compile().as_text()
    assert "vsurge_qmatmul" not in without


def test_accelerators_get_the_xla_path(monkeypatch):
    """The path is chosen when tracing, by the default backend (kernels.tracing_for_cpu): a GPU or TPU
    program dequantizes and dots, and only a CPU program holds the custom call."""
    w = from_gguf(gguf_blocks("q4_1", N, K), "q4_1")
    x = jnp.zeros((2, K), jnp.float32)
    if kernels.available():
        assert "vsurge_qmatmul" in jax.jit(qmatmul).lower(x, w).as_text()
    monkeypatch.setattr(kernels, "tracing_for_cpu", lambda: False)
    module = jax.jit(lambda a, b: qmatmul(a, b)).lower(x, w).as_text()  # (a new function: traced anew)
    assert "vsurge_qmatmul" not in module and "dot_general" in module


def test_leading_dims_and_empty_rows():
    raw = gguf_blocks("q8_0", N, K)
    w = from_gguf(raw, "q8_0")
    w_ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0).astype(np.float64)
    x = np.random.default_rng(5).normal(0, 1, (2, 3, K)).astype(np.float32)
    y = np.asarray(jax.jit(qmatmul)(jnp.asarray(x), w))
    assert y.shape == (2, 3, N)
    assert rel(y.reshape(6, N), x.reshape(6, K) @ w_ref.T) < ACTIVATION_ERROR
    assert jax.jit(qmatmul)(jnp.zeros((0, K)), w).shape == (0, N)
    mapped = jax.jit(jax.vmap(qmatmul, in_axes=(0, None)))(jnp.asarray(x), w)
    np.testing.assert_array_equal(np.asarray(mapped), y)


@needs_kernel
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("two_pass", [False, True])
def test_only_the_real_rows_are_multiplied(case, dtype, two_pass):
    """Inside `real_rows(mask)` an x shaped (1, N, K) is multiplied for its real rows only (a step's
    padding is skipped): the same bits as without the mask there, 0 elsewhere; an x of other rows
    (an expert's tokens, the output head's) ignores the mask."""
    from vsurge.ops.quantized import real_rows

    fmt, _, w, _ = case
    x = jnp.asarray(np.random.default_rng(6).normal(0, 1, (1, 37, K)), dtype)
    mask = np.zeros(37, bool)
    mask[[0, 3, 4, 5, 20, 36]] = True

    def masked(x, real, other):
        with real_rows(real):
            return qmatmul(x, w, two_pass=two_pass), qmatmul(other, w, two_pass=two_pass)

    other = x[0, :36].reshape(6, 6, K)  # 36 rows, not the token stream
    y, y_other = jax.jit(masked)(x, jnp.asarray(mask), other)
    plain = np.asarray(jax.jit(lambda x: qmatmul(x, w, two_pass=two_pass))(x))
    np.testing.assert_array_equal(np.asarray(y)[0, mask], plain[0, mask], err_msg=fmt)
    assert not np.asarray(y)[0, ~mask].any()
    np.testing.assert_array_equal(np.asarray(y_other).reshape(36, -1), plain[0, :36])
    none, _ = jax.jit(masked)(x, jnp.zeros(37, bool), other)
    assert not np.asarray(none).any()
    every, _ = jax.jit(masked)(x, jnp.ones(37, bool), other)
    np.testing.assert_array_equal(np.asarray(every), plain)


def test_weight_is_a_pytree_that_passes_through_jit():
    w = from_gguf(gguf_blocks("q4_k", N, K), "q4_k")
    leaves, treedef = jax.tree.flatten(w)
    assert len(leaves) == 1 and leaves[0].dtype == jnp.uint8
    assert jax.tree.unflatten(treedef, leaves) == w
    # 148 bytes per 256 weights (Q4_K's 144 with its 6-bit scales as bytes), 48 rows of tiles
    assert w.nbytes == 48 * K // 256 * 148
    same = jax.jit(lambda w: w)(w)
    assert isinstance(same, QuantizedWeight) and same.shape == w.shape


@pytest.mark.parametrize("fmt", QUANTIZABLE)
def test_quantize_float_weights(fmt):
    w = np.random.default_rng(6).normal(0, 0.02, (N, K)).astype(np.float32)
    q = quantize(jnp.asarray(w), fmt)
    w_q = np.asarray(jax.jit(dequantize)(q))
    qtype = FORMATS[fmt].qtype
    np.testing.assert_array_equal(w_q, gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype))
    blocks = np.abs(w).reshape(N, -1, 32).max(axis=-1, keepdims=True)
    levels = 127 if fmt == "q8_0" else (31 if fmt.startswith("q5") else 15)
    # round-to-nearest on a grid of step ~ 2 max / levels (Q8_0: max / 127): error within a step
    step = blocks / 127 if fmt == "q8_0" else 2 * blocks / levels
    assert np.all(np.abs(w_q - w).reshape(N, -1, 32) <= step * 1.01)


def test_bad_inputs_are_named():
    w = from_gguf(gguf_blocks("q4_0", N, K), "q4_0")
    with pytest.raises(ValueError, match=r"does not match W \(45, 512\)"):
        qmatmul(jnp.zeros((1, K + 32)), w)
    with pytest.raises(ValueError, match="unsupported quantized format"):
        from_gguf(np.zeros((2, 18), np.uint8), "q3_k")
    with pytest.raises(ValueError, match=r"hold a \(2, 32\) matrix"):
        from_gguf(np.zeros((2, 18), np.uint8), "q4_0", shape=(2, 64))
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize(np.zeros((4, 40), np.float32), "q8_0")
    with pytest.raises(ValueError, match="come from a GGUF file"):
        quantize(np.zeros((4, 256), np.float32), "q6_k")


@needs_kernel
def test_concurrent_calls_share_the_pool():
    """Two threads running the custom call at once: one gets the pool, the other runs its loop alone."""
    raw = gguf_blocks("q5_1", 1000, K)
    w = from_gguf(raw, "q5_1")
    x = jnp.asarray(np.random.default_rng(7).normal(0, 1, (16, K)).astype(np.float32))
    program = jax.jit(qmatmul)
    want = np.asarray(program(x, w))
    results, errors = [], []

    def run():
        try:
            for _ in range(20):
                results.append(np.asarray(program(x, w)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 40
    for y in results:
        np.testing.assert_array_equal(y, want)


@needs_kernel
def test_isa_switch_caps_the_variant():
    script = "from vsurge import kernels; print(kernels.variant(), kernels.cpu_isa())"
    env = {**os.environ, "VSURGE_CPU_ISA": "avx2"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["avx2", "avx2"]
    env["VSURGE_CPU_ISA"] = "none"
    out = subprocess.run([sys.executable, "-c", script + "; print(kernels.unavailable_reason())"], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.startswith("None ") and "disabled by VSURGE_CPU_ISA" in out.stdout


@needs_kernel
def test_a_rows_products_do_not_depend_on_the_rows_beside_it():
    """A weight's passes hold for every row however many rows are real (issue 60: a request's greedy
    tokens must not change with the load): a row alone and among 32 gives the same bits, in two passes
    and in one, and the two differ; an explicit two_pass overrides the weight; padding rows stay 0."""
    rng = np.random.default_rng(5)
    blocks = quantize(rng.standard_normal((48, 256)).astype(np.float32), "q4_1", 32)
    x = jnp.asarray(rng.standard_normal((1, 33, 256)).astype(np.float32))
    alone, busy = jnp.arange(33) == 0, jnp.arange(33) < 32

    @jax.jit
    def step(x, real, w):
        with real_rows(real):
            return qmatmul(x, w), qmatmul(x, w, two_pass=True)

    out = {}
    for passes in (1, 2):
        w = with_passes(blocks, passes)
        (lone, lone_two), (many, many_two) = step(x, alone, w), step(x, busy, w)
        np.testing.assert_array_equal(lone[0, 0], many[0, 0])
        np.testing.assert_array_equal(lone_two[0, 0], many_two[0, 0])
        assert float(jnp.abs(lone[0, 1:]).max()) == 0 and float(jnp.abs(many[0, 32]).max()) == 0
        np.testing.assert_array_equal(many[0, :32], qmatmul(x[0, :32], w))  # (no real rows: the plain call)
        out[passes] = many_two if passes == 1 else many
    np.testing.assert_array_equal(out[1], out[2])  # two_pass=True on a one-pass weight: two passes
    assert float(jnp.abs(step(x, busy, with_passes(blocks, 1))[0] - out[2]).max()) > 0
