"""Paged engine (oDriver) vs dense engine (vDriver) on the default model, in equal KV memory.

1. Mixed load: `--requests` prompts of random length in [32, 1024] tokens, `--output` tokens each,
   all submitted at once. The dense engine gets `--dense-slots` slots of max_length; the paged
   engine gets the same number of KV tokens as pages (and up to 32 sequences). Prints the peak
   number of sequences each engine held at once, output tok/s and TTFT.
2. Shared prefix: one request at a time, each a 512-token system prompt plus a different question;
   median TTFT with the prefix cache on vs off (the cache is emptied before every request).

    python benchmarks/paged.py [--requests 32] [--output 64] [--dense-slots 8] [--max-length 2048]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import numpy as np


async def run_one(surge, prompt_ids, tokens):
    from vsurge import SamplingParams

    start, first, count = time.perf_counter(), None, 0
    submission = surge.submit(prompt_ids, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True),
                              detokenize=False)
    async for samples in submission.updates():
        count += len(samples[0].token_ids)
        first = first or time.perf_counter()
    return first - start, count


async def mixed_load(surge, prompts, tokens):
    peak = 0

    async def watch():
        nonlocal peak
        while True:
            peak = max(peak, surge.driver.num_used_slots)
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    start = time.perf_counter()
    results = await asyncio.gather(*(run_one(surge, p, tokens) for p in prompts))
    wall = time.perf_counter() - start
    watcher.cancel()
    ttft = sorted(r[0] for r in results)
    return dict(peak=peak, tok_s=sum(r[1] for r in results) / wall, ttft_p50=statistics.median(ttft),
                ttft_mean=statistics.fmean(ttft), wall=wall)


async def prefix_ttft(surge, prefix, questions, reset):
    times = []
    for q in questions:
        if reset:
            surge.driver.engine.manager.reset_prefix_cache()
        ttft, _ = await run_one(surge, prefix + q, 1)
        times.append(ttft)
    return statistics.median(times[1:])  # the first request fills the cache in both cases


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--output", type=int, default=64)
    p.add_argument("--dense-slots", type=int, default=8)
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--page-size", type=int, default=32)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import vsurge
    from vsurge import vSurge

    model, processor = vsurge.load("default", progress=False)
    rng = np.random.default_rng(args.seed)
    vocab = model.config.vocab_size
    lengths = rng.integers(32, 1025, args.requests)
    prompts = [rng.integers(100, vocab - 100, n).tolist() for n in lengths]
    kv_tokens = args.dense_slots * args.max_length
    print(f"{args.requests} requests, prompts {lengths.min()}-{lengths.max()} tokens (mean {lengths.mean():.0f}), "
          f"{args.output} output tokens; KV memory for {kv_tokens} tokens in both engines\n", flush=True)

    dense = vSurge.create_vdriver(model, processor, max_concurrent_decodes=args.dense_slots,
                                  max_prefill_length=1024, max_length=args.max_length, max_queue=10**6)
    paged = vSurge.create_odriver(model, processor, max_concurrent_decodes=32, page_size=args.page_size,
                                  num_pages=kv_tokens // args.page_size, max_prefill_length=args.chunk,
                                  max_length=args.max_length, max_queue=10**6)
    rows = []
    for name, surge in (("dense vDriver", dense), ("paged oDriver", paged)):
        start = time.perf_counter()
        surge.compile()
        surge.start()
        print(f"{name}: compiled in {time.perf_counter() - start:.0f} s", flush=True)
        asyncio.run(mixed_load(surge, prompts[:2], 4))  # warm-up
        rows.append((name, asyncio.run(mixed_load(surge, prompts, args.output))))
        print(f"{name}: {rows[-1][1]}", flush=True)
        if surge is dense:
            surge.stop()

    prefix = rng.integers(100, vocab - 100, 512).tolist()
    questions = [rng.integers(100, vocab - 100, 16).tolist() for _ in range(6)]
    cached = asyncio.run(prefix_ttft(paged, prefix, questions, reset=False))
    uncached = asyncio.run(prefix_ttft(paged, prefix, questions, reset=True))
    paged.stop()

    (_, d), (_, o) = rows
    print("\n| engine | sequences held at once | output tok/s | TTFT mean / p50 s |")
    print("|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['peak']} | {r['tok_s']:.1f} | {r['ttft_mean']:.1f} / {r['ttft_p50']:.1f} |")
    print(f"\npaged / dense: {o['peak'] / d['peak']:.1f}x sequences, {o['tok_s'] / d['tok_s']:.2f}x output tok/s, "
          f"{o['ttft_p50'] / d['ttft_p50']:.2f}x p50 TTFT")
    print(f"512-token shared prefix, median TTFT: cached {cached * 1000:.0f} ms, uncached {uncached * 1000:.0f} ms "
          f"({cached / uncached:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
