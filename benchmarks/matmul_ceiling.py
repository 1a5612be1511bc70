"""The XLA:CPU ceiling for the default model's weight matmuls alone (no attention, no sampling).

30 layers of the model's matrix shapes + the output head, one jitted program,
float32 and int8 (two-pass activations, as vsurge's int8 path), with layers run
as a scan over stacked weights (vsurge's layout) and as an unrolled loop over
separate arrays. Prints tokens/s per batch size: the bound a decoder of this
size can reach on this machine.

    python benchmarks/matmul_ceiling.py [--batches 1,8,32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from vsurge.ops.linear import linear, quantize_int8

L, D, F, V = 30, 576, 1536, 49152
SHAPES = {"wqkv": (D, 960), "wo": (D, D), "gate_up": (D, 2 * F), "down": (F, D)}


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


def weights(int8: bool, rng):
    def make(shape):
        w = jnp.asarray(rng.normal(0, 0.02, shape).astype(np.float32))
        return quantize_int8(w) if int8 else (w, None)

    stacked = {k: make((L, *s)) for k, s in SHAPES.items()}
    per_layer = [jax.tree.map(lambda a: a[i] + 0, stacked) for i in range(L)]
    return stacked, per_layer, make((D, V))


def rate(fn, args, reps=7):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1 / statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,32")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print("| weights | layers as | " + " | ".join(f"B={b} tok/s" for b in args.batches.split(",")) + " |")
    print("|---|---|" + "---|" * len(args.batches.split(",")))
    for int8 in (False, True):
        stacked, per_layer, head = weights(int8, rng)
        for name, fn, w in (("scan (vsurge)", scanned, stacked), ("unrolled loop", unrolled, per_layer)):
            cells = []
            for b in map(int, args.batches.split(",")):
                x = jnp.asarray(rng.normal(0, 1, (b, D)).astype(np.float32))
                cells.append(f"{b * rate(jax.jit(fn), (w, head, x)):.1f}")
            print(f"| {'int8' if int8 else 'float32'} | {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
