"""The tpu backend's attention call alone (kv/backends/tpu.py: JAX's ragged paged-attention kernel over the
folded layout), against the bytes it must read: each row's K/V up to its length / the chip's bandwidth.

For each shape and row count it times the kernel at JAX's tuned block sizes ("tuned"), at the ones the tpu
backend asks for ("vsurge": kv/backends/tpu.block_sizes) and at each (KV pages, queries) per block given.
Decode rows (one query each) at the roofline benchmark's context; `--prefill` adds one prompt of that many
tokens.

    python benchmarks/tpu_attention.py --rows 64,256 --blocks 4x32,8x32,8x64,16x64      # on the TPU
    python benchmarks/tpu_attention.py --rows 64,256 --kernel ejkernel-v3   # ejkernel's v3 kernel, same rows

`--kernel ejkernel-v3` times the v3-design kernel of ejkernel (PyPI `ejkernel`, EasyDeL's kernels; it writes
the step's K/V itself and has a head_dim-64 variant) on its own page layout, at the same rows and lengths:
a measurement to choose by, not a backend vsurge uses.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from vsurge.config import AttentionSpec
from vsurge.kv.backends import tpu
from vsurge.kv.paged import StepLayout

SHAPES = {"1b": (32, 8, 64), "3b": (24, 8, 128), "8b": (32, 8, 128),  # query heads, KV heads, head_dim
          "default": (12, 4, 64)}  # SmolLM2-135M: 9 query / 3 KV heads, held as 12 / 4 (kv/backends/tpu.held_heads)
BANDWIDTH = {"TPU v5": 819e9, "TPU v6": 1640e9, "TPU v4": 1200e9}


def layout(rows: int, context: int, page: int, prefill: int):
    width = -(-(context + prefill) // page)
    rng = np.random.default_rng(0)
    pages = rng.permutation(rows * width + width + 1)
    tables = pages[: rows * width].reshape(rows, width)
    chunk_tables = pages[rows * width: rows * width + width][None] if prefill else np.zeros((0, width), int)
    chunk_pos = np.arange(prefill)[None] if prefill else np.zeros((0, 1), int)
    return StepLayout(slot_mapping=jnp.zeros((rows + prefill,), jnp.int32),
                      decode_tables=jnp.asarray(tables, jnp.int32),
                      decode_pos=jnp.full((rows, 1), context - 1, jnp.int32),
                      chunk_tables=jnp.asarray(chunk_tables, jnp.int32), chunk_pos=jnp.asarray(chunk_pos, jnp.int32)), \
        rows * width + width + 1


def timed(fn, reps=20) -> float:
    jax.block_until_ready(fn())
    walls = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        walls.append(time.perf_counter() - start)
    return statistics.median(walls)


def open_table(title: str, column: str) -> float | None:
    """Print the device and the table's header; -> the chip's bandwidth (bytes/s; None where unknown)."""
    kind = jax.devices()[0].device_kind
    print(f"device {kind}{title}", flush=True)
    print(f"| shape | rows | prefill | {column} | ms | bytes/bandwidth ms | % |\n|---|---|---|---|---|---|---|")
    return next((v for k, v in BANDWIDTH.items() if k in kind), None)


def row(shape, rows, prefill, label, wall, need, bandwidth) -> str:
    """A table row: the call's median time against its K/V bytes read once at the chip's bandwidth."""
    floor = need / bandwidth if bandwidth else None
    pct = f"{100 * floor / wall:.0f}%" if floor else "-"
    return f"| {shape} | {rows} | {prefill} | {label} | {wall * 1e3:.3f} | {floor * 1e3 if floor else 0:.3f} | {pct} |"


def v3_table(args) -> int:
    """The same decode rows (and optional prompt) through ejkernel's ragged_page_attention_v3."""
    from ejkernel.kernels._pallas.tpu.ragged_page_attention_v3 import ragged_page_attention_v3
    from ejkernel.kernels._pallas.tpu.ragged_page_attention_v3 import _pallas_impl_fwd as wide
    from ejkernel.kernels._pallas.tpu.ragged_page_attention_v3 import _pallas_impl_fwd_h64 as narrow

    bandwidth = open_table("; ejkernel ragged_page_attention_v3", "kernel")
    for shape in args.shapes.split(","):
        heads, kv_heads, dim = SHAPES[shape]
        for rows in (int(r) for r in args.rows.split(",")):
            seqs = rows + (1 if args.prefill else 0)
            width = -(-(args.context + args.prefill) // args.page_size)
            num_pages = seqs * width + 1
            shape_of = (narrow if dim == 64 else wide).get_kv_cache_shape
            cache = jnp.ones(shape_of(num_pages, args.page_size, kv_heads, dim, jnp.bfloat16), jnp.bfloat16)
            tokens = rows + args.prefill
            q = jnp.ones((tokens, heads, dim), jnp.bfloat16)
            k = v = jnp.ones((tokens, kv_heads, dim), jnp.bfloat16)
            tables = jnp.asarray(np.random.default_rng(0).permutation(num_pages)[: seqs * width], jnp.int32)
            lens = jnp.asarray([args.context] * rows + ([args.prefill] if args.prefill else []), jnp.int32)
            starts = jnp.asarray([*range(rows + 1)] + ([tokens] if args.prefill else []), jnp.int32)
            distribution = jnp.asarray([rows, rows, seqs], jnp.int32)  # decode-only end, prefill end, all
            step = jax.jit(lambda q, k, v, cache: ragged_page_attention_v3(
                q, k, v, cache, lens, tables, starts, distribution, softmax_scale=dim ** -0.5), donate_argnums=3)
            holder = {"cache": cache}

            def call():
                out, holder["cache"] = step(q, k, v, holder["cache"])
                return out

            need = (rows * args.context + args.prefill) * 2 * kv_heads * dim * 2
            try:
                wall = timed(call)
            except Exception as error:  # noqa: BLE001
                print(f"| {shape} | {rows} | {args.prefill} | v3 | {type(error).__name__}: {str(error)[:100]} | | |",
                      flush=True)
                continue
            print(row(shape, rows, args.prefill, "v3", wall, need, bandwidth), flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="1b,3b")
    p.add_argument("--rows", default="1,64,256")
    p.add_argument("--context", type=int, default=513)
    p.add_argument("--page-size", type=int, default=128)
    p.add_argument("--prefill", type=int, default=0)
    p.add_argument("--blocks", default="", help="comma-separated KVPAGESxQUERIES block sizes to try")
    p.add_argument("--vmem-mb", type=int, default=None)
    p.add_argument("--kernel", default="jax", choices=("jax", "ejkernel-v3"))
    args = p.parse_args(argv)
    if args.kernel == "ejkernel-v3":
        return v3_table(args)
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    bandwidth = open_table("", "blocks")
    for shape in args.shapes.split(","):
        heads, kv_heads, dim = SHAPES[shape]
        fold = tpu.fold_of(kv_heads, dim, dim)
        for rows in (int(r) for r in args.rows.split(",")):
            lay, num_pages = layout(rows, args.context, args.page_size, args.prefill)
            pool = jnp.ones((num_pages, args.page_size, 2 * kv_heads // fold, fold * dim), jnp.bfloat16)
            q = jnp.ones((rows + args.prefill, heads, dim), jnp.bfloat16)
            spec = AttentionSpec(scale=dim ** -0.5)
            need = (rows * args.context + args.prefill) * 2 * kv_heads * dim * 2  # every K/V read once
            width = lay.decode_tables.shape[1]  # (with a prompt the backend keeps the tuned sizes)
            for blocks in [None, "vsurge", *(b for b in args.blocks.split(",") if b)]:
                options = {}
                if blocks == "vsurge":  # what the tpu backend asks of the kernel for this step
                    options = tpu.block_sizes(lay, width)
                elif blocks:
                    kv, qs = (int(x) for x in blocks.split("x"))
                    options = dict(num_kv_pages_per_block=kv, num_queries_per_block=qs)
                if args.vmem_mb:
                    options["vmem_limit_bytes"] = args.vmem_mb << 20
                call = lambda *a, **k: ragged_paged_attention(*a, **k, **options)  # noqa: E731
                fn = jax.jit(lambda q, pool: tpu.ragged_attention(q, pool, lay, spec, kv_heads, call=call))
                try:
                    wall = timed(lambda: fn(q, pool))
                except Exception as error:  # noqa: BLE001  (a block size the kernel refuses: say so, go on)
                    print(f"| {shape} | {rows} | {args.prefill} | {blocks or 'tuned'} | {type(error).__name__}: "
                          f"{str(error)[:80]} | | |", flush=True)
                    continue
                print(row(shape, rows, args.prefill, blocks or "tuned", wall, need, bandwidth), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
