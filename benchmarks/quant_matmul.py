"""One decode token's weight matmuls at the default model's shapes: the quantized kernel vs XLA's dots.

SmolLM2-135M: 30 layers of qkv 576->960, o 576->576, gate_up 576->3072, down 1536->576, and the
output head 576->49152, chained as a layer chains them (matmul_ceiling.py's program), in one
jitted program per weight kind and row count M. Kinds: GGUF block formats through
`vsurge.ops.quantized.qmatmul` (the C++ kernel on CPU, per kernel variant; random valid blocks:
speed does not depend on the values), and float weights through `vsurge.ops.linear` as the engine
runs them today (bfloat16: bf16 x bf16 -> f32 dots; float32). The machine is shared, so the
programs are timed in turns (one call of each per round, `--reps` rounds): a burst of load from
elsewhere slows all rows alike. Prints per M the median ms per call (the fastest call's in
brackets), rows x calls per second, and GB/s of weight bytes read (each call reads all weights
once), with the CPU's ISA, the kernel's variant and threads and the machine's read bandwidth.

    python benchmarks/quant_matmul.py [--rows 1,2,8,32] [--formats q4_1,q8_0,q4_k] [--variants avx512_vnni,avx2,xla]
    XLA_FLAGS=--xla_cpu_max_isa=AVX2 VSURGE_CPU_ISA=avx2 python benchmarks/quant_matmul.py   # an AVX2-only CPU
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import gguf
import numpy as np

L, D, F, V = 30, 576, 1536, 49152
SHAPES = {"wqkv": (960, D), "wo": (D, D), "gate_up": (2 * F, D), "down": (D, F)}  # (N, K): y = x @ W^T
# byte offsets of each block's float16 scales (d, and dmin / m), set to small values
SCALES = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q4_k": (0, 2),
          "q5_k": (0, 2), "q6_k": (208,)}
# K-quants need K % 256 == 0 (576 is not): llama-quantize stores such tensors in these instead
K_QUANT_FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}


def stored_format(fmt: str, k: int) -> str:
    return K_QUANT_FALLBACK[fmt] if fmt in K_QUANT_FALLBACK and k % 256 else fmt


def random_gguf_blocks(n: int, k: int, fmt: str, rng) -> np.ndarray:
    qtype = gguf.GGMLQuantizationType[fmt.upper()]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    for offset in SCALES[fmt]:
        raw[:, :, offset:offset + 2] = scale
    return raw.reshape(n, -1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,8,32")
    parser.add_argument("--formats", default="q4_1,q8_0,q4_k")
    parser.add_argument("--variants", default="",
                        help="kernel variants to time, and 'xla' for the dequantizing XLA path (default: the kernel in use)")
    parser.add_argument("--floats", default="bfloat16,float32", help="XLA float weights to compare ('' for none)")
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp

    sys.path.insert(0, os.path.dirname(__file__))
    from common import measure_read_bandwidth
    from vsurge import kernels
    from vsurge.ops.linear import linear
    from vsurge.ops.quantized import from_gguf, qmatmul

    rows = [int(r) for r in args.rows.split(",")]
    rng = np.random.default_rng(0)

    def token(mm):
        def run(layers, head, x):
            for w in layers:
                h = mm(x, w["wqkv"])
                x = x + mm(h[:, :D], w["wo"])
                g = mm(x, w["gate_up"])
                x = x + mm(jax.nn.silu(g[:, :F]) * g[:, F:], w["down"])
            return mm(x, head)

        return jax.jit(run)

    kinds = []  # (label, program, weights, bytes, kernel variant or None)
    chosen = kernels.variant()
    variants = [v for v in args.variants.split(",") if v] or [chosen]
    for fmt in [f for f in args.formats.split(",") if f]:
        def weight(n, k):
            stored = stored_format(fmt, k)
            return from_gguf(random_gguf_blocks(n, k, stored, rng), stored)

        weights = ([{k: weight(*s) for k, s in SHAPES.items()} for _ in range(L)], weight(V, D))
        nbytes = sum(w.nbytes for w in jax.tree.leaves(weights))
        name = fmt if stored_format(fmt, D) == fmt else f"{fmt} ({stored_format(fmt, D)} where K = {D})"
        for v in variants:
            if v in (None, "xla"):  # dequantized to bfloat16 inside the program, then XLA's dot
                def xla_path(x, w):
                    return qmatmul(x.astype(jnp.bfloat16), w, use_kernel=False)

                kinds.append((f"{name}, XLA dequantize to bfloat16 + dot", token(xla_path), weights, nbytes, None))
            else:
                kinds.append((f"{name}, kernel {v}", token(qmatmul), weights, nbytes, v))
    for kind in [k for k in args.floats.split(",") if k]:
        dtype = jnp.dtype(kind)
        weights = ([{k: jnp.asarray(rng.normal(0, 0.02, s[::-1]), dtype) for k, s in SHAPES.items()} for _ in range(L)],
                   jnp.asarray(rng.normal(0, 0.02, (D, V)), dtype))
        nbytes = sum(w.nbytes for w in jax.tree.leaves(weights))
        kinds.append((f"{kind}, XLA dot (vsurge.ops.linear)", token(linear), weights, nbytes, None))

    inputs = {m: jnp.asarray(rng.normal(0, 1, (m, D)).astype(np.float32)) for m in rows}
    times = {(i, m): [] for i in range(len(kinds)) for m in rows}
    for rep in range(args.reps + 1):  # round 0 compiles and warms up
        for i, (_, program, weights, _, variant) in enumerate(kinds):
            if variant:
                kernels.set_variant(variant)
            for m in rows:
                start = time.perf_counter()
                program(*weights, inputs[m]).block_until_ready()
                if rep:
                    times[i, m].append(time.perf_counter() - start)

    if chosen:
        kernels.set_variant(chosen)
    print(f"CPU ISA: {kernels.cpu_isa()}; kernel: {chosen or 'none (' + str(kernels.unavailable_reason()) + ')'}"
          f", {kernels.threads()} threads; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; jax {jax.__version__}, "
          f"{os.cpu_count()} CPUs; shared machine: median (fastest) of {args.reps} rounds")
    print(f"machine read bandwidth (jitted float32 sum): {measure_read_bandwidth():.1f} GB/s\n")
    print("| weights | bytes per call | " + " | ".join(f"M={m}" for m in rows) + " |")
    print("|---|---|" + "---|" * len(rows))
    for i, (label, _, _, nbytes, _) in enumerate(kinds):
        cells = []
        for m in rows:
            s, fastest = statistics.median(times[i, m]), min(times[i, m])
            cells.append(f"{s * 1e3:.1f} ms ({fastest * 1e3:.1f}), {m / s:.0f} rows/s, {nbytes / s / 1e9:.1f} GB/s")
        print(f"| {label} | {nbytes / 1e6:.0f} MB | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
