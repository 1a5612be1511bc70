"""Paged-attention kernels of the column layout against its XLA path (kv/paged.py) on CPU: JAX's Triton
kernel (kv/kernels.py, the gpu backend) and vsurge's own C++ decode kernel (kv/cpu_attention.py,
kernels/paged_attention.cc). The tpu backend's layout and kernel: tests/kv/test_attention_backends.py.

Random pages, rows of ragged lengths (one page, a page boundary, several pages, a padding row),
page tables with holes (pages scattered over the pool, zeros past each row's length), GQA ratios,
soft-caps and sliding windows. The GPU kernel runs in Pallas interpret mode.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from vsurge.config import AttentionSpec
from vsurge.kv import kernels
from vsurge.kv import cpu_attention
from vsurge.kv.backends.columns import paged_attention, xla_paged_attention

POSITIONS = [0, 9, 30, -1, 17]  # ragged lengths; -1: a padding row
REAL = [i for i, p in enumerate(POSITIONS) if p >= 0]


def pages_and_rows(kv_heads: int, group: int, dim: int, page: int, width: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    num_pages, rows = 3 * width, len(POSITIONS)
    k = jnp.asarray(rng.normal(size=(num_pages, kv_heads, dim, page)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(num_pages, kv_heads, page, dim)), jnp.float32)
    q = jnp.asarray(rng.normal(size=(rows, 1, kv_heads * group, dim)), jnp.float32)
    tables = np.zeros((rows, width), np.int32)
    for i, pos in enumerate(POSITIONS):
        used = max(pos, 0) // page + 1
        tables[i, :used] = rng.choice(np.arange(1, num_pages), used, replace=False)  # scattered: holes
    return q, k, v, jnp.asarray(tables), jnp.asarray(np.asarray(POSITIONS, np.int32)[:, None])


def test_gpu_kernel_in_interpret_mode_equals_the_xla_path():
    q, k, v, tables, pos = pages_and_rows(kv_heads=2, group=4, dim=16, page=8, width=4)
    spec = AttentionSpec(scale=0.25, softcap=5.0)
    ours = xla_paged_attention(q, k, v, tables, pos, spec)
    theirs = kernels.gpu_decode(q, k, v, tables, pos, spec, interpret=True)
    np.testing.assert_allclose(np.asarray(theirs)[REAL], np.asarray(ours)[REAL], atol=2e-5, rtol=2e-5)


def test_the_gpu_kernel_serves_what_it_supports():
    spec, window = AttentionSpec(scale=0.1), AttentionSpec(scale=0.1, window=8)
    assert kernels.gpu_serves(1, 64, 64, spec, None)
    assert not kernels.gpu_serves(1, 64, 64, window, None)  # no sliding window in the GPU kernel
    assert not kernels.gpu_serves(16, 64, 64, spec, None)  # prompt rows: the XLA path
    assert not kernels.gpu_serves(1, 64, 64, spec, jnp.zeros(4))  # sinks
    assert not kernels.gpu_serves(1, 192, 128, spec, None)  # dk != dv (MLA)


# ------------------------------------------------------------------ the C++ decode kernel (CPU)
needs_kernel = pytest.mark.skipif(not cpu_attention.usable(jnp.zeros((1, 1, 1, 8)), jnp.zeros((1, 1, 8, 8)),
                                                            jnp.zeros((1, 1, 8, 8))),
                                  reason="vsurge's CPU kernels are not built here")


@needs_kernel
@pytest.mark.parametrize("kv_heads,group,dim,page,window,softcap,sinks", [
    (2, 4, 16, 8, None, None, False),   # GQA 4
    (3, 1, 64, 16, None, None, False),  # MHA, the default model's head_dim
    (1, 2, 24, 8, 11, None, False),     # sliding window over a page boundary
    (2, 2, 32, 8, None, 5.0, True),     # soft-cap and sinks
])
def test_cpu_decode_kernel_equals_the_xla_path(kv_heads, group, dim, page, window, softcap, sinks):
    q, k, v, tables, pos = pages_and_rows(kv_heads, group, dim, page, width=5, seed=dim)
    spec = AttentionSpec(scale=dim ** -0.5, window=window, softcap=softcap)
    sink = jnp.asarray(np.random.default_rng(3).normal(size=(kv_heads * group,)), jnp.float32) if sinks else None
    want = np.asarray(xla_paged_attention(q, k, v, tables, pos, spec, sink))
    got = np.asarray(jax.jit(lambda *a: cpu_attention.decode(*a, spec, sink))(q, k, v, tables, pos))
    np.testing.assert_allclose(got[REAL], want[REAL], atol=2e-5, rtol=2e-5)
    assert (got[POSITIONS.index(-1)] == 0).all()  # a padding row reads nothing
    routed = np.asarray(jax.jit(lambda *a: paged_attention(*a, spec, sink))(q, k, v, tables, pos))
    np.testing.assert_array_equal(routed, got)  # paged_attention takes the kernel for decode rows


@needs_kernel
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_cpu_decode_kernel_reads_16bit_pages(dtype):
    q, k, v, tables, pos = pages_and_rows(kv_heads=2, group=2, dim=64, page=16, width=3)
    k, v = k.astype(dtype), v.astype(dtype)
    spec = AttentionSpec(scale=0.125, window=21)
    # the reference: the same page values in float32 (XLA would round q to the pages' dtype too)
    want = np.asarray(xla_paged_attention(q, k.astype(jnp.float32), v.astype(jnp.float32), tables, pos, spec))
    got = np.asarray(cpu_attention.decode(q, k, v, tables, pos, spec))
    np.testing.assert_allclose(got[REAL], want[REAL], atol=1e-5, rtol=1e-5)
    assert cpu_attention.usable(q, k, v)


@needs_kernel
@pytest.mark.parametrize("dtype,tol", [(jnp.int8, 1e-5), (jnp.float8_e4m3fn, 1e-5)])
def test_cpu_decode_kernel_dequantizes_int8_and_fp8_pages_as_the_xla_path(dtype, tol):
    from vsurge.kv import quant

    q, k, v, tables, pos = pages_and_rows(kv_heads=2, group=3, dim=32, page=8, width=5, seed=7)
    # keys are stored (P, KVH, dk + 2, ps): quantized per token along dk, the scale rows after them
    kq = jnp.swapaxes(quant.store(jnp.swapaxes(k, -1, -2), dtype), -1, -2)
    vq = quant.store(v, dtype)
    spec = AttentionSpec(scale=32 ** -0.5, window=13)
    want = np.asarray(xla_paged_attention(q, kq, vq, tables, pos, spec))
    got = np.asarray(cpu_attention.decode(q, kq, vq, tables, pos, spec))
    np.testing.assert_allclose(got[REAL], want[REAL], atol=tol, rtol=tol)
    assert cpu_attention.usable(q, kq, vq)


@needs_kernel
@pytest.mark.parametrize("dtype,group,window,sinks", [
    (jnp.float32, 3, None, False),   # the default model's GQA ratio
    (jnp.float16, 4, 50, True),      # half pages read in place, a window and sinks across the parts
    (jnp.bfloat16, 1, None, False),
    (jnp.int8, 3, None, False),
])
def test_cpu_decode_kernel_splits_one_long_row_over_threads(dtype, group, window, sinks):
    """One row over 40 pages: its (row, KV head) work is split into runs of pages whose softmax
    statistics are merged; the result equals the XLA path on the same (dequantized) pages."""
    from vsurge.kv import quant

    rng = np.random.default_rng(11)
    kv_heads, dim, page, width = 2, 64, 8, 40
    k = jnp.asarray(rng.normal(size=(2 * width, kv_heads, dim, page)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(2 * width, kv_heads, page, dim)), jnp.float32)
    q = jnp.asarray(rng.normal(size=(2, 1, kv_heads * group, dim)), jnp.float32)
    tables = jnp.asarray(np.stack([rng.permutation(2 * width)[:width], np.zeros(width, int)]), jnp.int32)
    pos = jnp.asarray([[width * page - 3], [-1]], jnp.int32)  # a long row and a padding row
    spec = AttentionSpec(scale=dim ** -0.5, window=window)
    sink = jnp.asarray(rng.normal(size=(kv_heads * group,)), jnp.float32) if sinks else None
    if dtype == jnp.int8:
        kp, vp = jnp.swapaxes(quant.store(jnp.swapaxes(k, -1, -2), dtype), -1, -2), quant.store(v, dtype)
        want = np.asarray(xla_paged_attention(q, kp, vp, tables, pos, spec, sink))
    else:
        kp, vp = k.astype(dtype), v.astype(dtype)
        want = np.asarray(xla_paged_attention(q, kp.astype(jnp.float32), vp.astype(jnp.float32), tables, pos, spec,
                                              sink))
    got = np.asarray(cpu_attention.decode(q, kp, vp, tables, pos, spec, sink))
    np.testing.assert_allclose(got[0], want[0], atol=2e-5, rtol=2e-5)
    assert (got[1] == 0).all()


@needs_kernel
def test_cpu_decode_kernel_is_left_to_xla_where_it_does_not_apply():
    q, k, v, _, _ = pages_and_rows(kv_heads=2, group=2, dim=16, page=8, width=4)
    assert cpu_attention.usable(q, k, v)
    assert not cpu_attention.usable(jnp.zeros((2, 4, 4, 16)), k, v)  # prompt rows (4 tokens)
    assert not cpu_attention.usable(q, k[..., :6], v[:, :, :6])  # page size 6: not a multiple of 8


@pytest.mark.skipif(not cpu_attention.kernels.available(), reason="no C++ kernels")
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_16bit_pages_are_written_and_read_in_place_as_xla_would(dtype):
    """kv/access.py on CPU: the C++ write equals XLA's scatter (out-of-range pages and offsets dropped,
    keys along their last axis, values along the third), the C++ page read equals XLA's gather + cast,
    and the compiled program neither converts nor copies the whole pool (XLA:CPU did both)."""
    from vsurge.kv.access import KEY_AXIS, VALUE_AXIS, put_pages, read_pages, take_pages, write_tokens

    rng = np.random.default_rng(3)
    num_pages, heads, dim, page = 6, 2, 16, 8
    k = jnp.asarray(rng.normal(size=(num_pages, heads, dim, page)), dtype)
    v = jnp.asarray(rng.normal(size=(num_pages, heads, page, dim)), dtype)
    pages = jnp.asarray([1, 4, 4, 6, 0, 2], jnp.int32)  # 6: out of range, dropped
    offsets = jnp.asarray([0, 7, 3, 1, 8, 2], jnp.int32)  # 8: out of range, dropped
    x = jnp.asarray(rng.normal(size=(6, heads, dim)), jnp.float32)

    def both(kc, vc, p, o, xs):
        return write_tokens(kc, p, o, xs, KEY_AXIS), write_tokens(vc, p, o, xs, VALUE_AXIS)

    program = jax.jit(both, donate_argnums=(0, 1)).lower(k, v, pages, offsets, x).compile().as_text()
    assert "vsurge_kv_write" in program
    whole_pool = re.compile(rf"= \w+\[{num_pages},{heads},\d+,\d+\]\S* (convert|copy)\(")
    assert not [line for line in program.splitlines() if whole_pool.search(line)]
    expect_k = k.at[pages, :, :, offsets].set(x.astype(dtype), mode="drop")
    expect_v = v.at[pages, :, offsets].set(x.astype(dtype), mode="drop")
    got_k, got_v = jax.jit(both)(k, v, pages, offsets, x)
    np.testing.assert_array_equal(np.asarray(got_k, np.float32), np.asarray(expect_k, np.float32))
    np.testing.assert_array_equal(np.asarray(got_v, np.float32), np.asarray(expect_v, np.float32))

    ids = jnp.asarray([5, 0, 3, 3], jnp.int32)
    keys, values = jax.jit(lambda a, b, i: read_pages(a, b, i, jnp.float32))(got_k, got_v, ids)
    np.testing.assert_array_equal(np.asarray(keys), np.asarray(got_k[ids], np.float32))
    np.testing.assert_array_equal(np.asarray(values), np.asarray(got_v[ids], np.float32))

    # whole pages out and in as stored (the tiers' and transfers' copies): page 9 is padding, dropped
    taken = jax.jit(take_pages)(got_k, ids)
    assert taken.dtype == dtype
    np.testing.assert_array_equal(np.asarray(taken, np.float32), np.asarray(got_k[ids], np.float32))
    targets = jnp.asarray([2, 9, 4, 1], jnp.int32)
    program = jax.jit(put_pages, donate_argnums=0).lower(got_k, targets, taken).compile().as_text()
    assert "vsurge_put_pages" in program and not [l for l in program.splitlines() if whole_pool.search(l)]
    put = jax.jit(put_pages)(got_k, targets, taken)
    expected = got_k.at[targets].set(taken, mode="drop")
    np.testing.assert_array_equal(np.asarray(put, np.float32), np.asarray(expected, np.float32))
