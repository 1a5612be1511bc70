"""The CPU decode-attention kernel alone (kv/cpu_attention.py, kernels/paged_attention.cc): one step's
attention over 30 layers of the default model's shape (3 KV heads, 9 query heads, head size 64,
128-token float16 pages, each layer's pages apart from the others', so they come from memory as in a
real step), at a few row counts and context lengths. Prints milliseconds per step and the KV bytes
read per second; medians of 20 calls.

    python benchmarks/cpu_attention.py        # VSURGE_KERNEL_THREADS=1 for one thread
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from vsurge import kernels
from vsurge.config import AttentionSpec
from vsurge.kv import cpu_attention

LAYERS, WIDTH, KV_HEADS, HEAD_DIM, PAGE, HEADS = 30, 32, 3, 64, 128, 9
LOADS = [(1, 128), (1, 2000), (1, 4000), (2, 4000), (4, 4000), (16, 1000)]  # (rows, context tokens)


def step_ms(rows: int, context: int, k, v, rng) -> float:
    tables = [jnp.asarray(np.stack([rng.permutation(np.arange(l * WIDTH, (l + 1) * WIDTH)) for _ in range(rows)]),
                          jnp.int32) for l in range(LAYERS)]
    q = jnp.asarray(rng.standard_normal((rows, 1, HEADS, HEAD_DIM)), jnp.float32)
    pos = jnp.full((rows, 1), context - 1, jnp.int32)
    spec = AttentionSpec(scale=HEAD_DIM ** -0.5)

    @jax.jit
    def layers(q, k, v, tables, pos):
        out = q
        for table in tables:  # each layer's output feeds the next, as in a model
            out = out + cpu_attention.decode(out, k, v, table, pos, spec)
        return out

    layers(q, k, v, tables, pos).block_until_ready()
    times = []
    for _ in range(20):
        start = time.perf_counter()
        layers(q, k, v, tables, pos).block_until_ready()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main() -> int:
    if not kernels.available():
        raise SystemExit(f"the CPU kernels are not built: {kernels.unavailable_reason()}")
    rng = np.random.default_rng(0)
    pages = LAYERS * WIDTH
    k = jnp.asarray(rng.standard_normal((pages, KV_HEADS, HEAD_DIM, PAGE)), jnp.float16)
    v = jnp.asarray(rng.standard_normal((pages, KV_HEADS, PAGE, HEAD_DIM)), jnp.float16)
    print(f"`python benchmarks/cpu_attention.py`, CPU ISA {kernels.cpu_isa()}, {time.strftime('%Y-%m-%d')}\n")
    print("| rows | context | ms per step (30 layers) | KV GB/s |\n|---|---|---|---|")
    for rows, context in LOADS:
        ms = step_ms(rows, context, k, v, rng)
        nbytes = LAYERS * rows * context * KV_HEADS * HEAD_DIM * 2 * 2  # keys and values, float16
        print(f"| {rows} | {context} | {ms:.2f} | {nbytes / ms / 1e6:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
