"""How long XLA takes to compile each stage of the step's sampling on this backend (a TPU's sort is slow to
compile: it was 12 of a decode program's 33 s of XLA there):

    python benchmarks/sampling_compile.py [--rows 64] [--vocab 49152]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from vsurge.ops import sampling


def timed_compile(name: str, fn, *args) -> None:
    began = time.perf_counter()
    jax.jit(fn).lower(*args).compile()
    print(f"{name:40s} {time.perf_counter() - began:6.2f} s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--vocab", type=int, default=49152)
    args = p.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)
    logits = jax.ShapeDtypeStruct((args.rows, args.vocab), jnp.float32)
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                          sampling.SamplingArrays.neutral(args.rows))
    steps = jax.ShapeDtypeStruct((args.rows,), jnp.int32)
    counts = jax.ShapeDtypeStruct((args.rows, args.vocab), jnp.int32)
    mask = jax.ShapeDtypeStruct((args.rows, args.vocab), jnp.bool_)
    print(f"{jax.devices()[0].device_kind}: {args.rows} rows x {args.vocab} vocabulary", flush=True)
    timed_compile("full sort", lambda x: jnp.sort(x, axis=-1), logits)
    timed_compile(f"top_k {sampling.CANDIDATES}", lambda x: jax.lax.top_k(x, sampling.CANDIDATES), logits)
    timed_compile(f"top_k {sampling.TOP_LOGPROBS}", lambda x: jax.lax.top_k(x, sampling.TOP_LOGPROBS), logits)
    timed_compile("filter (top-k candidates + sort fallback)", sampling._filter, logits, params)
    timed_compile("exact filter (full sort)", sampling._filter_sorted, logits, params)
    timed_compile("inverse CDF", sampling.inverse_cdf, logits, steps.update(dtype=jnp.float32))
    timed_compile("draw_tokens", sampling.draw_tokens, logits, params, steps)
    timed_compile("sample (penalties + draw)", sampling.sample, logits, counts, mask, params, steps)
    timed_compile("token_logprobs", sampling.token_logprobs, logits, steps)
    np.zeros(1)


if __name__ == "__main__":
    main()
