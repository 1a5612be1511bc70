"""Inter-token latency of streams already decoding while long prompts arrive: disaggregated vs interleaved.

Same devices in total (two by default; on CPU they are forced host devices):

    interleaved     2 data-parallel replicas, one device each; every replica prefills its share of the
                    long prompts inside the steps that also decode its streams (chunked prefill)
    disaggregated   a prefill engine on device 0, a decode engine on device 1 (engine/disaggregated.py)

Workload: `--streams` requests (8) start and decode (ignore_eos); once each has streamed a few tokens,
`--long` prompts (8) of `--long-tokens` (1500) random token ids arrive at once. The window runs from
their arrival until the last of them has its first token. Reported per mode: the streams' inter-token
latency inside the window (the gap between two updates of a stream divided by the tokens the second
brought, as vsurge:inter_token_latency_seconds counts it; and the raw gap between updates, what a
streaming client sees), p50 / p99 / max, the long prompts' TTFT, and the window's length.

    python benchmarks/disaggregated.py                                    # both modes, the defaults
    python benchmarks/disaggregated.py --long-tokens 200 --streams 2 --long 2 --max-length 512   # a smoke run
    python benchmarks/disaggregated.py --compilation-cache ~/.cache/vsurge/xla   # later runs skip compiling

XLA_FLAGS=--xla_force_host_platform_device_count=N is set here when not given (N = --devices).
On CPU the forced devices share the machine's cores, so a prefill engine's steps slow the decode
engine's down as well (they compete for the same cores): the split only shows its effect on
devices that do not share compute (two GPUs, or TPU chips).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["both", "interleaved", "disaggregated"], default="both")
    p.add_argument("--devices", type=int, default=2, help="devices in all (half prefill, half decode)")
    p.add_argument("--streams", type=int, default=8, help="requests decoding when the long prompts arrive")
    p.add_argument("--long", type=int, default=8, help="long prompts arriving at once")
    p.add_argument("--long-tokens", type=int, default=1500, help="tokens of each long prompt")
    p.add_argument("--warm-tokens", type=int, default=8, help="tokens every stream has before they arrive")
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--model", default="default")
    p.add_argument("--dtype", default=None)
    p.add_argument("--rounds", type=int, default=2,
                   help="workload rounds per mode; the last is reported (the first pays programs' first runs)")
    p.add_argument("--compilation-cache", default=None, metavar="DIR", help="JAX's persistent compilation cache")
    p.add_argument("--json", action="store_true", help="one JSON line per mode only")
    return p.parse_args()


def percentile(values, q: float):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def build(mode: str, model, processor, args):
    from vsurge import vSurge

    half = args.devices // 2
    common = dict(max_concurrent_decodes=max(16, args.streams + args.long), max_length=args.max_length,
                  max_queue=1024, hbm_utilization=0.3)
    if mode == "interleaved":
        return vSurge.create_odriver(model, processor, tensor_parallel_size=1, data_parallel_size=args.devices,
                                     **common)
    if half < 1:
        raise SystemExit("disaggregated mode needs at least 2 devices")
    return vSurge.create_odriver(model, processor, prefill_devices=list(range(half)),
                                 decode_devices=list(range(half, 2 * half)), **common)


async def workload(surge, processor, args) -> dict:
    import numpy as np

    from vsurge import SamplingParams

    rng = np.random.default_rng(0)
    stream_params = SamplingParams(max_tokens=args.max_length - 64, temperature=0.0, ignore_eos=True)
    long_params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompts = [processor.encode(f"Tell me a long story about the number {i}.") for i in range(args.streams)]
    longs = [rng.integers(100, 40000, args.long_tokens).tolist() for _ in range(args.long)]
    updates: list[list[tuple[float, int]]] = [[] for _ in prompts]  # (time, tokens) per stream update
    warmed, window = asyncio.Event(), {"start": None, "end": None}
    firsts: list[float] = []

    async def stream(i):
        submission = surge.submit(prompts[i], stream_params, detokenize=False)
        try:
            async for samples in submission.updates():
                n = sum(len(s.token_ids) for s in samples)
                if n:
                    updates[i].append((time.perf_counter(), n))
                if all(sum(k for _, k in u) >= args.warm_tokens for u in updates):
                    warmed.set()
                if window["end"] is not None and time.perf_counter() > window["end"] + 0.5:
                    return  # leaving the loop cancels the request
        finally:
            submission.cancel()

    async def long_prompt(ids):
        start = time.perf_counter()
        async for samples in surge.submit(ids, long_params, detokenize=False).updates():
            if any(s.token_ids for s in samples):
                firsts.append(time.perf_counter() - start)
                return

    streams = [asyncio.create_task(stream(i)) for i in range(len(prompts))]
    await warmed.wait()
    window["start"] = time.perf_counter()
    await asyncio.gather(*(long_prompt(ids) for ids in longs))
    window["end"] = time.perf_counter()
    await asyncio.gather(*streams)

    per_token, gaps = [], []
    for u in updates:
        for (t0, _), (t1, n) in zip(u, u[1:]):
            if window["start"] <= t1 <= window["end"]:
                gaps.append(t1 - t0)
                per_token += [(t1 - t0) / n] * n
    return {"window_s": window["end"] - window["start"], "itl_p50_s": percentile(per_token, 0.5),
            "itl_p99_s": percentile(per_token, 0.99), "itl_max_s": max(per_token, default=None),
            "update_gap_p50_s": percentile(gaps, 0.5), "update_gap_p99_s": percentile(gaps, 0.99),
            "update_gap_max_s": max(gaps, default=None), "window_tokens": len(per_token),
            "long_ttft_p50_s": statistics.median(firsts), "long_ttft_max_s": max(firsts)}


def main() -> int:
    args = parse()
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.devices}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import jax

    import vsurge
    from vsurge.kernels import cpu_isa

    if jax.device_count() < args.devices:
        raise SystemExit(f"{args.devices} devices wanted, {jax.device_count()} visible (XLA_FLAGS was set before?)")
    if args.compilation_cache:
        from vsurge.cli.local_engine import use_cache_dir

        use_cache_dir(args.compilation_cache)
    model, processor = vsurge.load(args.model, dtype=args.dtype, progress=False)
    modes = ["interleaved", "disaggregated"] if args.mode == "both" else [args.mode]
    results = {}
    for mode in modes:
        surge = build(mode, model, processor, args)
        begin = time.perf_counter()
        surge.compile()
        surge.start()
        compiled = time.perf_counter() - begin
        try:
            for _ in range(args.rounds):
                result = asyncio.run(workload(surge, processor, args))
        finally:
            surge.stop(5)
        result.update(mode=mode, compile_s=compiled, rounds=args.rounds, devices=args.devices, streams=args.streams,
                      long=args.long,
                      long_tokens=args.long_tokens, platform=jax.devices()[0].platform, cpu_isa=cpu_isa(),
                      transfers=surge.metrics.value("vsurge:kv_transfer_seconds_count"))
        results[mode] = result
        print(json.dumps(result), flush=True)
    if not args.json and len(results) == 2:
        i, d = results["interleaved"], results["disaggregated"]
        print(f"\nCPU ISA {cpu_isa()}, {args.devices} devices\n{'':24}{'interleaved':>14}{'disaggregated':>16}",
              file=sys.stderr)
        for key in ("itl_p50_s", "itl_p99_s", "update_gap_p99_s", "long_ttft_p50_s", "long_ttft_max_s", "window_s"):
            print(f"{key:24}{i[key]:>14.4f}{d[key]:>16.4f}", file=sys.stderr)
        print(f"p99 ITL, disaggregated / interleaved: {d['itl_p99_s'] / i['itl_p99_s']:.2f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
