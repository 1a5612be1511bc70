"""Attention backends (kv/backends): the choice, and each layout's write + attention against the XLA reference.

The tpu backend's layout (P, ps, 2 KVH / f, f d) is written and read on CPU: its page-column fallback and the
arguments it builds for JAX's ragged kernel (through that module's own pure-JAX reference: the Pallas kernel
cannot run in TPU interpret mode on CPU with jax 0.10.2) must give what the column layout's XLA path gives on
the same keys and values: ragged lengths, page-table holes, GQA ratios, a window, soft-caps, head_dim 64 folded
two KV heads to 128 lanes, an odd KV head count (no fold), and a mixed step of decode and prompt-chunk rows.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vsurge.config import AttentionSpec, KVLayer
from vsurge.kv import backends
from vsurge.kv.backends import tpu
from vsurge.kv.paged import PagedAttentionCache, StepLayout, page_bytes


def test_auto_picks_the_platforms_backend_and_names_are_checked():
    assert backends.resolve("auto", "tpu") == "tpu"
    assert backends.resolve(None, "cpu") == "cpu"
    assert backends.resolve("auto", "gpu") == "xla"  # the Triton kernel's per-step re-lay stays opt-in
    assert backends.resolve("xla", "tpu") == "xla"
    with pytest.raises(ValueError, match="attention_backend must be one of auto, cpu, xla, gpu, tpu"):
        backends.resolve("mosaic", "tpu")


def test_engine_config_declares_the_flag():
    from vsurge.engine.engine_config import EngineConfig

    assert EngineConfig().attention_backend == "auto"
    with pytest.raises(ValueError, match="attention_backend"):
        EngineConfig(attention_backend="mosaic")


def test_tpu_layout_refuses_quantized_pages_by_name():
    with pytest.raises(ValueError, match="tpu attention backend stores float pages.*int8"):
        backends.get("tpu").init_pools((KVLayer(heads=2, k_dim=64, v_dim=64),), 4, 8, jnp.int8)


@pytest.mark.parametrize("heads,k_dim,v_dim,held,fold", [(8, 64, 64, 8, 2), (3, 64, 64, 4, 2), (2, 128, 128, 2, 1),
                                                        (4, 32, 32, 4, 4), (2, 96, 64, 2, 1), (3, 128, 128, 4, 1),
                                                        (1, 256, 256, 1, 1), (3, 80, 80, 3, 1)])
def test_tpu_pools_keep_the_bytes_of_their_keys_and_values(heads, k_dim, v_dim, held, fold):
    """No lanes padded; a head count the kernel does not tile gets the fewest zero heads that it does (three KV
    heads: four), and the pool's page bytes (what sizes it) say so."""
    layer = KVLayer(heads=heads, k_dim=k_dim, v_dim=v_dim)
    k, v = backends.get("tpu").init_pools((layer,), 5, 16, jnp.bfloat16)
    assert tpu.held_heads(heads, k_dim, v_dim, jnp.bfloat16) == held
    assert k[0].size + v[0].size == 5 * 16 * held * (k_dim + v_dim)
    assert page_bytes((layer,), 16, jnp.bfloat16, backends.get("tpu").held_heads) * 5 == \
        (k[0].size + v[0].size) * 2
    assert tpu.fold_of(held, k_dim, v_dim) == fold
    if tpu.kernel_layout(heads, k_dim, v_dim, jnp.bfloat16):
        assert k[0].shape == (5, 16, 2 * held // fold, fold * k_dim) and v[0].shape == (5, 0)
    else:  # pages only XLA's loop reads: heads-major, keys and values apart
        assert k[0].shape == (5, heads, 16, k_dim) and v[0].shape == (5, heads, 16, v_dim)


def test_only_layers_the_kernel_serves_take_its_combined_layout():
    combined = [(8, 64, 64), (3, 64, 64), (2, 128, 128), (4, 32, 32), (3, 128, 128)]
    heads_major = [(2, 96, 64), (1, 256, 256), (4, 256, 256), (3, 80, 80)]  # dk != dv, 256 lanes, never 128 lanes
    assert all(tpu.kernel_layout(*shape, jnp.bfloat16) for shape in combined)
    assert not any(tpu.kernel_layout(*shape, jnp.bfloat16) for shape in heads_major)


def test_the_kernel_is_asked_only_for_head_counts_it_tiles():
    assert tpu.tileable(8, jnp.bfloat16) and tpu.tileable(16, jnp.bfloat16) and tpu.tileable(4, jnp.bfloat16)
    assert not tpu.tileable(6, jnp.bfloat16)  # three KV heads of 128 lanes: the XLA loop
    assert tpu.tileable(6, jnp.float32) is False and tpu.tileable(8, jnp.float32)


def test_the_kernel_is_asked_only_for_heads_of_128_lanes():
    # 64-lane heads fold to 128; 256 (Gemma, Qwen3.5) failed to compile on a v5e: XLA's loop serves them
    assert tpu.kernel_lanes(128) and not tpu.kernel_lanes(256) and not tpu.kernel_lanes(64)
    assert tpu.fold_of(8, 64, 64) == 2 and tpu.fold_of(2, 256, 256) == 1


# ------------------------------------------------------------------ one step on both layouts
def step(kv_heads, group, dim, page, decode_pos, chunk_rows, seed=0, v_dim=None):
    """A pool with history, then one step: decode rows at `decode_pos` (-1 padding) and chunk rows
    (start, real tokens, C) whose tokens are written this step. Returns (layers, q, k, v, layout, history)."""
    rng = np.random.default_rng(seed)
    v_dim = v_dim or dim
    c = max((row[2] for row in chunk_rows), default=1)
    lengths = [p + 1 for p in decode_pos if p >= 0] + [s + n for s, n, _ in chunk_rows]
    width = max(-(-(max(lengths) + c) // page), 1)
    num_pages = 3 * width * (len(decode_pos) + len(chunk_rows)) + 1
    free = list(rng.permutation(np.arange(num_pages))[: num_pages - 1])  # scattered: holes
    tables, slots, q_rows = [], [], []
    # decode rows: history [0, pos), this step's token at pos
    history = []  # (page, offset) of every earlier token
    d_tables = np.full((len(decode_pos), width), num_pages, np.int32)  # padding: out of range
    for i, pos in enumerate(decode_pos):
        if pos < 0:
            slots.append(num_pages * page)
            continue
        used = pos // page + 1
        d_tables[i, :used] = [free.pop() for _ in range(used)]
        history += [(d_tables[i, t // page], t % page) for t in range(pos)]
        slots.append(d_tables[i, pos // page] * page + pos % page)
    c_tables = np.full((len(chunk_rows), width), num_pages, np.int32)
    c_pos = np.full((len(chunk_rows), c), -1, np.int32)
    for i, (start, n, _) in enumerate(chunk_rows):
        used = -(-(start + n) // page)
        c_tables[i, :used] = [free.pop() for _ in range(used)]
        history += [(c_tables[i, t // page], t % page) for t in range(start)]
        c_pos[i, :n] = np.arange(start, start + n)
    for i, (start, n, _) in enumerate(chunk_rows):
        for j in range(c):
            t = start + j
            slots.append(c_tables[i, t // page] * page + t % page if j < n else num_pages * page)
    n_tokens = len(decode_pos) + len(chunk_rows) * c
    q = jnp.asarray(rng.normal(size=(1, n_tokens, kv_heads * group, dim)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, n_tokens, kv_heads, dim)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(1, n_tokens, kv_heads, v_dim)), jnp.float32)
    layout = StepLayout(slot_mapping=jnp.asarray(slots, jnp.int32), decode_tables=jnp.asarray(d_tables),
                        decode_pos=jnp.asarray(np.asarray(decode_pos, np.int32)[:, None]),
                        chunk_tables=jnp.asarray(c_tables), chunk_pos=jnp.asarray(c_pos))
    hist_slots = jnp.asarray([p * page + o for p, o in history] or [num_pages * page], jnp.int32)
    hk = jnp.asarray(rng.normal(size=(1, hist_slots.shape[0], kv_heads, dim)), jnp.float32)
    hv = jnp.asarray(rng.normal(size=(1, hist_slots.shape[0], kv_heads, v_dim)), jnp.float32)
    layers = (KVLayer(heads=kv_heads, k_dim=dim, v_dim=v_dim),)
    return layers, num_pages, q, k, v, layout, (hist_slots, hk, hv)


def run(backend, layers, num_pages, page, q, k, v, layout, history, spec, sinks=None):
    """Write the history through a prompt-only layout, then attend the step; -> ((N, H, dv), cache)."""
    cache = PagedAttentionCache.init(layers, num_pages, page, jnp.float32, backend=backend)
    slots, hk, hv = history
    fill = StepLayout(slot_mapping=slots, decode_tables=jnp.zeros((1, 1), jnp.int32),
                      decode_pos=jnp.full((1, 1), -1, jnp.int32), chunk_tables=jnp.zeros((0, 1), jnp.int32),
                      chunk_pos=jnp.zeros((0, 1), jnp.int32))
    hq = jnp.zeros((1, slots.shape[0] + 0, q.shape[2], q.shape[3]), jnp.float32)
    # (the fill's one padding decode row needs one query: the history's first token stands in)
    _, cache = cache.for_step(fill).attend(0, hq[:, :1], hk[:, :1] * 0, hv[:, :1] * 0, None, spec)
    cache = cache.for_step(dataclasses_replace(fill, slot_mapping=slots, decode_tables=jnp.zeros((0, 1), jnp.int32),
                                               decode_pos=jnp.zeros((0, 1), jnp.int32),
                                               chunk_tables=jnp.zeros((1, 1), jnp.int32),
                                               chunk_pos=jnp.full((1, slots.shape[0]), -1, jnp.int32)))
    _, cache = cache.attend(0, hq, hk, hv, None, spec)
    out, cache = cache.for_step(layout).attend(0, q, k, v, None, spec, sinks)
    return np.asarray(out[0]), cache


def dataclasses_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


def real_rows(layout):
    """Indices of the step's tokens whose outputs count (not padding)."""
    d = [i for i, p in enumerate(np.asarray(layout.decode_pos)[:, 0]) if p >= 0]
    base = len(np.asarray(layout.decode_pos))
    c = np.asarray(layout.chunk_pos)
    return d + [base + i for i, p in enumerate(c.reshape(-1)) if p >= 0]


CASES = [  # kv_heads, group, dim, page, decode positions, chunk rows (start, real tokens, C)
    (8, 4, 64, 8, [0, 9, 30, -1, 17], [(5, 7, 8), (0, 3, 8)]),  # head_dim 64 folded in pairs, a window below
    (3, 3, 64, 16, [40, -1, 2], [(16, 16, 16)]),  # the default model's heads: odd KVH, held as four, folded
    (2, 1, 128, 8, [23, 7], [(9, 4, 4)]),  # MHA, full lanes
    (2, 2, 256, 8, [12, -1, 5], [(8, 6, 8)]),  # 256-lane heads (Gemma, Qwen3.5): heads-major pages, XLA's loop
]


@pytest.mark.parametrize("kv_heads,group,dim,page,decode_pos,chunks", CASES)
@pytest.mark.parametrize("window,softcap", [(None, None), (11, 5.0)])
def test_tpu_layout_step_equals_the_column_layout(kv_heads, group, dim, page, decode_pos, chunks, window, softcap):
    layers, num_pages, q, k, v, layout, history = step(kv_heads, group, dim, page, decode_pos, chunks, seed=dim)
    spec = AttentionSpec(scale=dim ** -0.5, window=window, softcap=softcap)
    want, _ = run("xla", layers, num_pages, page, q, k, v, layout, history, spec)
    got, cache = run("tpu", layers, num_pages, page, q, k, v, layout, history, spec)
    rows = real_rows(layout)
    np.testing.assert_allclose(got[rows], want[rows], atol=2e-5, rtol=2e-5)
    if cache.v[0].ndim == 2:  # combined pages: the ragged kernel's arguments, through its reference
        from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ref_ragged_paged_attention

        theirs = np.asarray(tpu.ragged_attention(q[0], cache.k[0], layout, spec, kv_heads,
                                                 call=ref_ragged_paged_attention))
        np.testing.assert_allclose(theirs[rows], want[rows], atol=2e-5, rtol=2e-5)


def test_tpu_layout_with_sinks_and_keys_wider_than_values():
    layers, num_pages, q, k, v, layout, history = step(2, 2, 96, 8, [12, 3], [(4, 5, 8)], seed=5, v_dim=64)
    spec = AttentionSpec(scale=0.1)
    sinks = jnp.asarray(np.random.default_rng(1).normal(size=(4,)), jnp.float32)
    want, _ = run("xla", layers, num_pages, 8, q, k, v, layout, history, spec, sinks)
    got, cache = run("tpu", layers, num_pages, 8, q, k, v, layout, history, spec, sinks)
    assert cache.k[0].shape == (num_pages, 2, 8, 96) and cache.v[0].shape == (num_pages, 2, 8, 64)  # heads-major
    rows = real_rows(layout)
    np.testing.assert_allclose(got[rows], want[rows], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("kv_heads,group,dim,pool", [(8, 4, 64, "8,8,128"), (2, 2, 256, "2,8,256")])
def test_tpu_layout_write_copies_nothing_the_size_of_the_pool(kv_heads, group, dim, pool):
    """The compiled step over a donated pool scatters rows in place: no copy, convert or transpose of an
    array the size of the layer's pool (the column layout's TPU path re-laid every page every step), for the
    kernel's combined pages and the heads-major ones of 256-lane heads. float32 pages: XLA:CPU has no 16-bit
    scatter and converts around one (a TPU scatters bfloat16 natively)."""
    layers, num_pages, q, k, v, layout, _ = step(kv_heads, group, dim, 8, [9, 30, 17], [], seed=2)
    cache = PagedAttentionCache.init(layers, num_pages, 8, jnp.float32, backend="tpu")
    spec = AttentionSpec(scale=0.125)

    def one(cache, q, k, v, layout):
        out, cache = cache.for_step(layout).attend(0, q, k, v, None, spec)
        return out, cache.storage_only()

    text = jax.jit(one, donate_argnums=(0,)).lower(cache, q, k, v, layout).compile().as_text()
    relaid = re.compile(rf"= \w+\[{num_pages},{pool}\]\S* (copy|convert|transpose)\(")
    assert not [line for line in text.splitlines() if relaid.search(line)]
    assert [line for line in text.splitlines() if f"[{num_pages},{pool}]" in line and "scatter" in line]


def test_decode_only_steps_ask_the_kernel_for_whole_page_tables_and_small_query_blocks():
    """The block sizes measured on a v5e (tpu.block_sizes): a decode-only step takes a row's whole table in one
    block of pages (at most DECODE_KV_PAGES), 8 queries a block; a step with prompt chunks keeps JAX's tuned ones."""
    decode_only = step(8, 4, 64, 8, [9, 30, 17], [], seed=2)[5]
    mixed = step(8, 4, 64, 8, [9, 30], [(5, 7, 8)], seed=2)[5]
    assert tpu.block_sizes(decode_only, 5) == {"num_kv_pages_per_block": 5, "num_queries_per_block": 8}
    assert tpu.block_sizes(decode_only, 64)["num_kv_pages_per_block"] == tpu.DECODE_KV_PAGES
    assert tpu.block_sizes(mixed, 5) == {}


def test_the_tpu_kernel_does_not_run_in_interpret_mode_on_cpu_yet():
    """Pinned so that a jax whose TPU interpreter runs the kernel shows up (then test it in interpret mode)."""
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    layers, num_pages, q, k, v, layout, history = step(2, 2, 128, 8, [9, 3], [], seed=4)
    _, cache = run("tpu", layers, num_pages, 8, q, k, v, layout, history, AttentionSpec(scale=0.1))
    with pytest.raises(Exception, match="ReshapeTransform|indices"), pltpu.force_tpu_interpret_mode():
        # (block sizes given: the kernel's own lookup of tuned ones asks for a TPU's version first)
        call = lambda *a, **k: ragged_paged_attention(*a, **k, num_kv_pages_per_block=1,  # noqa: E731
                                                      num_queries_per_block=8)
        jax.block_until_ready(tpu.ragged_attention(q[0], cache.k[0], layout, AttentionSpec(scale=0.1), 2, call=call))


# ------------------------------------------------------------------ an engine on the tpu layout (CPU)
# gemma3: windows, preemption (5 pages); both tiny models' 16-lane heads are kept heads-major, 64-lane ones
# take the kernel's combined pages (folded in pairs)
@pytest.mark.parametrize("name,pages", [("llama", 16), ("gemma3", 5), ("llama-64-lane-heads", 16)])
def test_an_engine_on_the_tpu_layout_gives_the_reference_tokens(name, pages, tiny_checkpoints, default_processor_dir,
                                                                 tmp_path):
    import asyncio

    import vsurge
    from vsurge import EngineConfig, SamplingParams, vSurge
    from dense_generator import greedy_generate
    from tiny_models import write_tiny_model

    prompts = ["one two three one two three one two", "The ducks of the river ran past the mill"]
    if name == "llama-64-lane-heads":
        write_tiny_model("llama", tmp_path, default_processor_dir, head_dim=64)
        folder = tmp_path
    else:
        folder = tiny_checkpoints[name][0]
    model, processor = vsurge.load(folder, dtype=jnp.float32, progress=False)
    config = EngineConfig(max_slots=4, max_length=64, prefill_tokens=16, chunk_lengths=(16,), row_buckets=(4,),
                          window_buckets=(4,), prefill_first=True, page_size=16, decode_steps=4, num_pages=pages,
                          attention_backend="tpu")
    surge = vSurge.create_odriver(model, processor, config=config)
    assert surge.engine.attention_backend == "tpu"
    combined = name == "llama-64-lane-heads"
    assert all(tpu.kernel_layout(l.heads, l.k_dim, l.v_dim, jnp.float32) == combined for l in model.config.kv_layout)
    surge.compile()
    surge.start()
    try:
        params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
        got = [r.token_ids for r in asyncio.run(surge.generate(prompts, params))]
    finally:
        surge.stop(5)
    assert got == [greedy_generate(model, processor.encode(p), 30) for p in prompts]
