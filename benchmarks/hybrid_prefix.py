"""Prefix cache on a hybrid model (issue 36's rows): 16 concurrent prompts sharing a 2000-token prefix.

A Qwen3.5-shaped hybrid with random bfloat16 weights (three Gated DeltaNet layers to one gated
attention layer; `--hidden`, `--layers`), on the paged engine. Each of `--requests` prompts is the
same `--prefix` random tokens plus `--tail` tokens of its own; all are submitted at once, each asks
for `--output` greedy tokens. Run with the prefix cache (the default: recurrent states snapshotted
at page ends of prompt rows, docs/state_cache.md) and without it (`enable_prefix_caching=False`),
each after a warm-up round of other prompts, each in its own process (a run that outlasts
`--timeout` is killed and tried again, and the output says so). Prints the prompt tokens each run
computed (those sent less those the cache held) and the TTFT p50 (time to each request's first
streamed token, submitted together), and the ratios.

    python benchmarks/hybrid_prefix.py [--prefix 2000] [--requests 16] [--hidden 512] [--layers 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from vsurge import EngineConfig, SamplingParams, vSurge  # noqa: E402
from vsurge.config import Rope  # noqa: E402
from vsurge.models.families.qwen3_next import Qwen3Next, Qwen3NextConfig  # noqa: E402


def hybrid_model(hidden: int, layers: int) -> Qwen3Next:
    heads = hidden // 128
    config = Qwen3NextConfig(
        architecture="qwen3_5_text", vocab_size=32000, hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=max(1, heads // 4), head_dim=256, qk_norm=True, max_position_embeddings=8192,
        eos_token_ids=(0,), intermediate_size=hidden * 3, rope=Rope(theta=1e7, dim=64),
        linear_layers=tuple((i + 1) % 4 != 0 for i in range(layers)), linear_key_heads=heads,
        linear_value_heads=heads, linear_key_dim=128, linear_value_dim=128, grouped_projections=False)
    return Qwen3Next(config, dtype=jnp.float32, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0)).prepare_mixed_dtypes()


async def one_round(surge, prompts, output: int) -> list[float]:
    """TTFT of each prompt, all submitted at once."""
    params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()

    async def first_token(ids):
        ttft = None
        async for _ in surge.stream_ids(ids, params, detokenize=False):
            ttft = ttft or time.perf_counter() - start
        return ttft

    return list(await asyncio.gather(*(first_token(p) for p in prompts)))


def measure(model, processor, prompts, warm, args, prefix_cache: bool) -> tuple[int, float]:
    config = EngineConfig(max_slots=args.requests, max_length=args.prefix + args.tail + args.output + 8,
                          enable_prefix_caching=prefix_cache)
    surge = vSurge.create_odriver(model, processor, config=config)
    surge.compile()
    surge.start()
    try:
        pool = surge.driver.engines[0].pool
        asyncio.run(one_round(surge, warm, args.output))  # every program the measured round runs, run once
        hits = pool.prefix_hits
        ttfts = asyncio.run(one_round(surge, prompts, args.output))
        return sum(map(len, prompts)) - (pool.prefix_hits - hits), statistics.median(ttfts)
    finally:
        surge.stop(10)


def run_alone(args, prefix_cache: bool, tries: int = 3) -> tuple[int, float]:
    """measure() in a fresh process: (prompt tokens computed, TTFT p50 s). A process whose step never
    finishes is killed and the run tried again, said so."""
    argv = [sys.executable, __file__, "--measure", "on" if prefix_cache else "off",
            *(f"--{k}={v}" for k, v in vars(args).items() if k != "measure")]
    for attempt in range(1, tries + 1):
        try:
            out = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True, timeout=args.timeout).stdout
            return tuple(json.loads(out.strip().splitlines()[-1]))
        except subprocess.TimeoutExpired:
            print(f"run {attempt} (prefix cache {'on' if prefix_cache else 'off'}) hung past {args.timeout} s: "
                  f"killed", flush=True)
    raise SystemExit(f"every one of {tries} runs hung")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefix", type=int, default=2000)
    p.add_argument("--tail", type=int, default=16)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--output", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--timeout", type=int, default=600, help="seconds one run may take before it counts as hung")
    p.add_argument("--measure", choices=("on", "off"), help=argparse.SUPPRESS)  # one run, in this process
    args = p.parse_args()
    from vsurge.kernels import cpu_isa
    from vsurge.loading import load_processor

    model = hybrid_model(args.hidden, args.layers)
    if args.measure:
        rng = np.random.default_rng(0)
        tokens = lambda n: rng.integers(100, 30000, n).tolist()  # noqa: E731
        prefix = tokens(args.prefix)
        prompts = [prefix + tokens(args.tail) for _ in range(args.requests)]
        other = tokens(args.prefix)  # the warm-up round: the same shapes, another prefix
        warm = [other + tokens(args.tail) for _ in range(args.requests)]
        result = measure(model, load_processor("default"), prompts, warm, args, args.measure == "on")
        print(json.dumps(result), flush=True)
        return 0
    print(f"CPU ISA: {cpu_isa()}; Qwen3.5-shaped hybrid, {model.num_params / 1e6:.0f}M params, bfloat16 weights, "
          f"paged engine defaults; {args.requests} concurrent prompts of a shared {args.prefix}-token prefix + "
          f"{args.tail} own tokens, {args.output} output tokens\n", flush=True)
    on = run_alone(args, True)
    print(f"with the prefix cache: {on[0]} prompt tokens computed, TTFT p50 {on[1]:.2f} s", flush=True)
    off = run_alone(args, False)
    print(f"without: {off[0]} prompt tokens computed, TTFT p50 {off[1]:.2f} s\n", flush=True)
    print("| prefix cache | prompt tokens computed | TTFT p50 s |")
    print("|---|---|---|")
    print(f"| on (state snapshots) | {on[0]} | {on[1]:.2f} |")
    print(f"| off | {off[0]} | {off[1]:.2f} |")
    print(f"| on / off | {on[0] / off[0]:.3f}x | {on[1] / off[1]:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
