"""The compiled sampler alone: ms per call of `ops/sampling.draw_tokens` for B rows of a V-token
vocabulary, greedy, sampled at temperature 1, and sampled under top-p 0.9 (the filters' partial sort).

    python benchmarks/sampling.py [--rows 1,8,32] [--vocab 49152]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,8,32")
    p.add_argument("--vocab", type=int, default=49152, help="the default model's")
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from vsurge import kernels
    from vsurge.ops.sampling import SamplingArrays, draw_tokens
    from vsurge.sampling.params import SamplingParams

    print(f"CPU ISA {kernels.cpu_isa()}; vocabulary {args.vocab}; median ms of {args.reps} calls\n")
    print("| rows | greedy | temperature 1 | temperature 1, top-p 0.9 |")
    print("|---|---|---|---|")
    rng = np.random.default_rng(0)
    step = jax.jit(draw_tokens)
    for b in (int(r) for r in args.rows.split(",")):
        logits = jnp.asarray(rng.standard_normal((b, args.vocab)) * 3, jnp.float32)
        steps = jnp.arange(b, dtype=jnp.int32)
        cells = []
        for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.0),
                       SamplingParams(temperature=1.0, top_p=0.9)):
            arrays = SamplingArrays.from_params([params] * b, seeds=list(range(b)))
            step(logits, arrays, steps).block_until_ready()
            times = []
            for _ in range(args.reps):
                start = time.perf_counter()
                step(logits, arrays, steps).block_until_ready()
                times.append(time.perf_counter() - start)
            cells.append(f"{statistics.median(times) * 1e3:.2f}")
        print(f"| {b} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
