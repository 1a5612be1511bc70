"""The XLA:CPU ceiling for the default model's weight matmuls alone (no attention, no sampling).

30 layers of the model's matrix shapes + the output head, one jitted program,
with weights in float32, bfloat16 (bf16 x bf16 -> f32 dots, vsurge's default)
and int8 (two-pass int8 activations, vsurge's `quantization="int8"`), layers
run as a scan over stacked weights and as an unrolled loop over separate arrays
(vsurge's layout). Prints tokens/s per batch size: the bound a decoder of this
size can reach on this machine. `--flags` repeats the table in subprocesses
under each XLA:CPU switch the issue lists (docs/performance.md records them).

    python benchmarks/matmul_ceiling.py [--batches 1,2,16,32,512] [--flags]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

L, D, F, V = 30, 576, 1536, 49152
SHAPES = {"wqkv": (D, 960), "wo": (D, D), "gate_up": (D, 2 * F), "down": (F, D)}
FLAGS = ["", "--xla_cpu_use_xnnpack=false", "--xla_cpu_experimental_xnn_fusion_type=dot",
         "--xla_cpu_experimental_ynn_fusion_type=dot", "--xla_cpu_use_onednn=true",
         "--xla_cpu_experimental_onednn_fusion_type=dot"]


def run_table(batches: list[int]) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from common import measure_read_bandwidth
    from vsurge.ops.linear import linear, quantize_int8

    def layer(x, w):
        h = linear(x, *w["wqkv"])
        x = x + linear(h[:, :D], *w["wo"])
        g = linear(x, *w["gate_up"])
        return x + linear(jax.nn.silu(g[:, :F]) * g[:, F:], *w["down"])

    def scanned(stacked, head, x):
        x, _ = jax.lax.scan(lambda x, w: (layer(x, w), None), x, stacked)
        return linear(x, *head)

    def unrolled(per_layer, head, x):
        for w in per_layer:
            x = layer(x, w)
        return linear(x, *head)

    def weights(kind, rng):
        def make(shape):
            w = jnp.asarray(rng.normal(0, 0.02, shape).astype(np.float32))
            if kind == "int8":
                return quantize_int8(w)
            return (w.astype(jnp.bfloat16) if kind == "bfloat16" else w), None

        stacked = {k: make((L, *s)) for k, s in SHAPES.items()}
        per_layer = [jax.tree.map(lambda a: a[i] + 0, stacked) for i in range(L)]
        return stacked, per_layer, make((D, V))

    def rate(fn, args, reps=5):
        jax.block_until_ready(fn(*args))
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - start)
        return 1 / statistics.median(times)

    def weight_bytes(per_layer, head):
        return sum(a.nbytes for a in jax.tree.leaves((per_layer, head)))

    rng = np.random.default_rng(0)
    read_rates = []
    print("| weights | layers as | " + " | ".join(f"B={b} tok/s" for b in batches) + " |")
    print("|---|---|" + "---|" * len(batches))
    for kind in ("float32", "bfloat16", "int8"):
        stacked, per_layer, head = weights(kind, rng)
        for name, fn, w in (("scan", scanned, stacked), ("unrolled (vsurge)", unrolled, per_layer)):
            cells = []
            for b in batches:
                x = jnp.asarray(rng.normal(0, 1, (b, D)).astype(np.float32))
                calls = rate(jax.jit(fn), (w, head, x))
                cells.append(f"{b * calls:.0f}")
                if b == 2 and fn is unrolled:
                    read_rates.append(f"{kind} {weight_bytes(w, head) * calls / 1e9:.1f} GB/s")
            print(f"| {kind} | {name} | " + " | ".join(cells) + " |", flush=True)
    if read_rates:
        print(f"\nWeights read per second at B=2, unrolled: {', '.join(read_rates)}; the machine reads "
              f"memory at {measure_read_bandwidth():.1f} GB/s (a jitted sum, benchmarks/common.py).", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,16,32,512")
    parser.add_argument("--flags", action="store_true", help="one table per XLA:CPU switch, each in a subprocess")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    if not args.flags:
        run_table(batches)
        return 0
    for flag in FLAGS:
        print(f"\nXLA_FLAGS={flag or '(none)'}\n", flush=True)
        subprocess.run([sys.executable, __file__, "--batches", args.batches],
                       env={**os.environ, "XLA_FLAGS": flag}, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
