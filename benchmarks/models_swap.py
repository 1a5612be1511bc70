"""Several models in one server: how long an unloaded model's first request waits (warm compilation cache),
and whether requests survive models swapping under `--max-loaded-models 1`.

The server holds the default model twice under two names (`--model default --model copy=<its GGUF>`), at
most one loaded: each name's first request after the other's must unload the other and load it.

    1. cold first requests: requests alternate one at a time, each a swap: TTFT (16 tokens, streamed)
    2. 200 requests alternating between the two names, 8 at a time: failures (must be 0), swaps, time

    python benchmarks/models_swap.py [--requests 200] [--concurrency 8] [--write-readme]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import Server, isa_line, vsurge_cmd, write_readme  # noqa: E402

from vsurge.cli.bench_serve import run  # noqa: E402
from vsurge.loading import default_model_path  # noqa: E402

NAMES = ("SmolLM2-135M-Instruct", "copy")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--swaps", type=int, default=4, help="cold first requests to time")
    p.add_argument("--write-readme", action="store_true")
    args = p.parse_args()
    print(isa_line(), flush=True)
    server = Server("vsurge", vsurge_cmd(f"--model default --model copy={default_model_path()} "
                                         "--max-loaded-models 1"), "/readiness")
    try:
        start_s = server.wait_ready()
        cold = []
        for i in range(args.swaps + 1):  # the first warms the copy's compilation (its programs are the default's)
            summary = asyncio.run(run(server.base, NAMES[(i + 1) % 2], 1, 12, 16, float("inf"), 1, None, 2))
            if i:
                cold.append(summary["ttft"]["median"])
        catalog = httpx.get(server.base + "/v1/stats", timeout=30).json()["catalog"]
        loads_before = sum(m["loads"] for m in catalog)
        start = time.perf_counter()
        summary = asyncio.run(run(server.base, list(NAMES), args.requests, 12, 16, float("inf"), args.concurrency,
                                  None, 2))
        took = time.perf_counter() - start
        catalog = httpx.get(server.base + "/v1/stats", timeout=30).json()["catalog"]
        swaps = sum(m["loads"] for m in catalog) - loads_before
        load_seconds = {m["id"]: m["load_seconds"] for m in catalog}
    finally:
        server.stop()
    lines = [f"`python benchmarks/models_swap.py`, the default model under two names, `--max-loaded-models 1`; "
             f"{time.strftime('%Y-%m-%d')}, this {os.cpu_count()}-core machine ({isa_line()}), one run.", "",
             "| measure | value |", "|---|---|",
             f"| an unloaded model's first request, TTFT p50 of {len(cold)} (warm compilation cache) | "
             f"{statistics.median(cold):.2f} s (max {max(cold):.2f}) |",
             f"| the last load of each, start to serving | "
             + ", ".join(f"{v:.2f} s" for v in load_seconds.values() if v) + " |",
             f"| {args.requests} requests alternating between the two, {args.concurrency} at a time: failed | "
             f"{summary['failed']} of {args.requests} |",
             f"| the same: swaps, wall time | {swaps} loads, {took:.1f} s |",
             f"| server start to ready | {start_s:.1f} s |"]
    text = "\n".join(lines)
    print(text)
    if summary["failed"]:
        print(summary["errors"], file=sys.stderr)
    if args.write_readme:
        write_readme(text, "models-swap-table")
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
