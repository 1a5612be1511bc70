"""The block kernel on one matrix shape by rows and passes: how fast it streams weights from memory.

`--copies` distinct random matrices of one shape (default: the ~1B Llama's 5632 x 2048 MLP, as
gguf_memory.py makes it) are multiplied in a chain inside one jitted program, each call's input
made from the last one's output, so the weights come from memory rather than from the cache (16
copies of a Q4_K 5632 x 2048 are 100 MB). Prints per format, rows M and passes (1: the
activations rounded to 8 bits, llama.cpp's arithmetic; 2: the default below ~1B parameters,
ops/quantized.py activation_passes) the median ms per matrix over `--reps` calls and the GB/s of weights read, with the CPU's
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

    from vsurge.ops.quantized import from_gguf

    n, k = (int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    print_machine(args, n, k, "")
    print("| format | rows | passes | ms per matrix | GB/s |")
    print("|---|---|---|---|---|")
    for fmt in args.formats.split(","):
        weights = [from_gguf(random_gguf_blocks(n, k, fmt, rng), fmt) for _ in range(args.copies)]
        nbytes = sum(w.data.nbytes for w in weights)
        for m in (int(r) for r in args.rows.split(",")):
            for passes in (1, 2):
                program = chained(n, k, passes == 2)
                x = rng.normal(0, 1, (m, k)).astype(np.float32)
                t = statistics.median(timed(program, x, {"w": weights}, args.reps)["w"])
                print(f"| {fmt} | {m} | {passes} | {t / args.copies * 1e3:.3f} | {nbytes / t / 1e9:.1f} |", flush=True)
    return 0


def print_machine(args, n: int, k: int, how: str) -> None:
    from vsurge import kernels

    print(f"CPU ISA {kernels.cpu_isa()}, block kernel {kernels.variant()}, {kernels.threads()} threads; "
          f"{args.copies} matrices of {n} x {k} chained{how}; median of {args.reps} calls\n")


def chained(n: int, k: int, two_pass: bool):
    """A jitted program multiplying x (M, K) by each weight of a list in turn, each call's input made
    from the last one's output (so the weights come from memory, not from the cache)."""
    import jax
    import jax.numpy as jnp

    from vsurge.ops.quantized import qmatmul

    def chain(x, weights):
        for w in weights:  # (M, N) -> the next call's (M, K)
            y = qmatmul(x, w, two_pass=two_pass)
            x = x + 1e-3 * jnp.tile(y, (1, -(-k // n)))[:, :k]
        return x

    return jax.jit(chain)


def timed(program, x: np.ndarray, sets: dict, reps: int) -> dict[str, list[float]]:
    """Seconds per call of `program(x, weights)` for each named set of weights, the sets in turns."""
    import jax.numpy as jnp

    x = jnp.asarray(x)
    for weights in sets.values():
        program(x, weights).block_until_ready()
    times = {name: [] for name in sets}
    for _ in range(reps):
        for name, weights in sets.items():
            start = time.perf_counter()
            program(x, weights).block_until_ready()
            times[name].append(time.perf_counter() - start)
    return times


def compare_huge_pages(args) -> int:
    from vsurge.loading.huge_pages import use_huge_pages
    from vsurge.ops.quantized import from_gguf

    n, k = (int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    print_machine(args, n, k, ", one pass, in turns")
    print("| format | rows | ms per matrix, 4 KiB pages | on 2 MiB pages | ratio |")
    print("|---|---|---|---|---|")
    program = chained(n, k, False)
    for fmt in args.formats.split(","):
        sets = {pages: [from_gguf(random_gguf_blocks(n, k, fmt, rng), fmt) for _ in range(args.copies)]
                for pages in ("4k", "2m")}
        if not use_huge_pages([w.data for w in sets["2m"]]):
            print(f"{fmt}: this kernel gave no huge pages (VSURGE_HUGE_PAGES=0, Linux < 6.1, or THP off)")
            return 1
        for m in (int(r) for r in args.rows.split(",")):
            times = timed(program, rng.normal(0, 1, (m, k)).astype(np.float32), sets, args.reps)
            small, huge = (statistics.median(times[p]) / args.copies * 1e3 for p in ("4k", "2m"))
            print(f"| {fmt} | {m} | {small:.3f} | {huge:.3f} | {huge / small:.2f}x |", flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
