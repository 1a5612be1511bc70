"""The block kernel on one matrix shape by rows and passes: how fast it streams weights from memory.

`--copies` distinct random matrices of one shape (default: the ~1B Llama's 5632 x 2048 MLP, as
gguf_memory.py makes it) are multiplied in a chain inside one jitted program, each call's input
made from the last one's output, so the weights come from memory rather than from the cache (16
copies of a Q4_K 5632 x 2048 are 100 MB). Prints per format, rows M and passes (1: the
activations rounded to 8 bits, llama.cpp's arithmetic; 2: the models' default, ops/quantized.py
TWO_PASS) the median ms per matrix over `--reps` calls and the GB/s of weights read, with the CPU's
ISA and the kernel's variant and threads.

    python benchmarks/kernel_rows.py [--shape 5632,2048] [--formats q4_k,q6_k] [--rows 1,2,8,16]
    VSURGE_KERNEL=avx2 python benchmarks/kernel_rows.py      # the AVX2 variant on an AVX-512 machine

`--compare-huge-pages`: two sets of the same matrices, one moved onto 2 MiB pages
(loading/huge_pages.py, as `vsurge.load` does) and one left on 4 KiB pages, timed in turns in one
process (one pass), so the machine's noise falls on both alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from quant_matmul import random_gguf_blocks  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="5632,2048", help="N,K of y = x @ W^T")
    p.add_argument("--formats", default="q4_k,q6_k")
    p.add_argument("--rows", default="1,2,8,16")
    p.add_argument("--copies", type=int, default=16)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--compare-huge-pages", action="store_true")
    args = p.parse_args(argv)
    if args.compare_huge_pages:
        return compare_huge_pages(args)

    import jax
    import jax.numpy as jnp

    from vsurge import kernels
    from vsurge.ops.quantized import from_gguf, qmatmul

    n, k = (int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    print(f"CPU ISA {kernels.cpu_isa()}, block kernel {kernels.variant()}, {kernels.threads()} threads; "
          f"{args.copies} matrices of {n} x {k} chained; median of {args.reps} calls\n")
    print("| format | rows | passes | ms per matrix | GB/s |")
    print("|---|---|---|---|---|")
    for fmt in args.formats.split(","):
        weights = [from_gguf(random_gguf_blocks(n, k, fmt, rng), fmt) for _ in range(args.copies)]
        nbytes = sum(w.data.nbytes for w in weights)
        for m in (int(r) for r in args.rows.split(",")):
            for passes in (1, 2):
                def chain(x, weights, two_pass=passes == 2):
                    for w in weights:  # (M, N) -> the next call's (M, K)
                        y = qmatmul(x, w, two_pass=two_pass)
                        x = x + 1e-3 * jnp.tile(y, (1, -(-k // n)))[:, :k]
                    return x

                program = jax.jit(chain)
                x = jnp.asarray(rng.normal(0, 1, (m, k)).astype(np.float32))
                program(x, weights).block_until_ready()
                times = []
                for _ in range(args.reps):
                    start = time.perf_counter()
                    program(x, weights).block_until_ready()
                    times.append(time.perf_counter() - start)
                t = statistics.median(times)
                print(f"| {fmt} | {m} | {passes} | {t / args.copies * 1e3:.3f} | {nbytes / t / 1e9:.1f} |", flush=True)
    return 0


def compare_huge_pages(args) -> int:
    import jax
    import jax.numpy as jnp

    from vsurge import kernels
    from vsurge.loading.huge_pages import use_huge_pages
    from vsurge.ops.quantized import from_gguf, qmatmul

    n, k = (int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    print(f"CPU ISA {kernels.cpu_isa()}, block kernel {kernels.variant()}, {kernels.threads()} threads; "
          f"{args.copies} matrices of {n} x {k} chained, one pass; median of {args.reps} calls, in turns\n")
    print("| format | rows | ms per matrix, 4 KiB pages | on 2 MiB pages | ratio |")
    print("|---|---|---|---|---|")
    for fmt in args.formats.split(","):
        sets = {}
        for pages in ("4k", "2m"):
            sets[pages] = [from_gguf(random_gguf_blocks(n, k, fmt, rng), fmt) for _ in range(args.copies)]
        moved = use_huge_pages([w.data for w in sets["2m"]])
        if not moved:
            print(f"{fmt}: this kernel gave no huge pages (VSURGE_HUGE_PAGES=0, Linux < 6.1, or THP off)")
            return 1

        def chain(x, weights):
            for w in weights:
                y = qmatmul(x, w, two_pass=False)
                x = x + 1e-3 * jnp.tile(y, (1, -(-k // n)))[:, :k]
            return x

        program = jax.jit(chain)
        for m in (int(r) for r in args.rows.split(",")):
            x = jnp.asarray(rng.normal(0, 1, (m, k)).astype(np.float32))
            times = {pages: [] for pages in sets}
            for pages in sets:
                program(x, sets[pages]).block_until_ready()
            for _ in range(args.reps):
                for pages, weights in sets.items():
                    start = time.perf_counter()
                    program(x, weights).block_until_ready()
                    times[pages].append(time.perf_counter() - start)
            small, huge = (statistics.median(times[p]) / args.copies * 1e3 for p in ("4k", "2m"))
            print(f"| {fmt} | {m} | {small:.3f} | {huge:.3f} | {huge / small:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
