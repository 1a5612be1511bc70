"""Prefix-cache benchmark: in-flight sharing, and the disk tier across a restart (`vsurge serve`, default model).

1. Shared preamble: 32 requests, 16 at once, each a ~500-word preamble (the same for all) plus
   its own 128-word prompt, 128 greedy output tokens, streamed: with in-flight sharing (the
   default: a request waits for preamble pages another request is computing) and without it
   (`--prefix-wait-steps 0`). Prints tok/s and TTFT p50 of both and their ratios.
2. Restart: a long prompt (about `--long-tokens` tokens) to a server with an empty `--kv-cache-dir`
   (cold TTFT), again (warm: in the device pool), then the server restarts on the same directory
   and it is sent again (its pages come from disk). Prints the three TTFTs and the ratios.

    python benchmarks/prefix_tiers.py [--skip-shared] [--skip-restart]

Run it alone on the machine (`flock /tmp/heavy.lock`): its numbers are wall-clock times.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import Server, vsurge_cmd  # noqa: E402

from vsurge.bench_serve import format_summary, random_prompt, run  # noqa: E402


def isa() -> str:
    from vsurge.kernels import cpu_isa

    return cpu_isa()


def serve(extra: str) -> Server:
    server = Server("vsurge", vsurge_cmd(extra), "/readiness")
    server.wait_ready()
    return server


def shared_load(extra: str) -> dict:
    server = serve(extra)
    try:
        summary = asyncio.run(run(server.base, server.model(), 32, 128, 128, float("inf"), 16, None, 2,
                                  shared_prefix_len=500))
    finally:
        server.stop()
    print(format_summary(f"vsurge {extra or '(defaults)'} · 32 requests, 16 at once, shared 500-word preamble",
                         summary), flush=True)
    return summary


def ttft(server: Server, prompt: str) -> float:
    body = {"model": server.model(), "prompt": prompt, "max_tokens": 4, "temperature": 0.0, "stream": True}
    start = time.perf_counter()
    with httpx.stream("POST", server.base + "/v1/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and '"text"' in line:
                return time.perf_counter() - start
    raise RuntimeError("no token received")


def restart(tokens: int, max_length: int) -> dict:
    prompt = random_prompt(random.Random(7), tokens)
    with tempfile.TemporaryDirectory(prefix="vsurge-kv-") as kv_dir:
        extra = f"--kv-cache-dir {kv_dir} --max-length {max_length}"
        server = serve(extra)
        try:
            ttft(server, "Hello there")  # the first request after start-up pays its own costs
            cold = ttft(server, prompt)
            warm = ttft(server, prompt)
        finally:
            server.stop()
        server = serve(extra)
        try:
            disk = ttft(server, prompt)
        finally:
            server.stop()
    return {"cold": cold, "warm": warm, "disk": disk}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip-shared", action="store_true")
    p.add_argument("--skip-restart", action="store_true")
    p.add_argument("--long-tokens", type=int, default=2400, help="tokens (about) of the restart prompt")
    p.add_argument("--max-length", type=int, default=4096)
    args = p.parse_args(argv)
    lines = [f"`python benchmarks/prefix_tiers.py`, default model, CPU ISA {isa()}, "
             f"{time.strftime('%Y-%m-%d')}, one run.", ""]
    if not args.skip_shared:
        on, off = shared_load(""), shared_load("--prefix-wait-steps 0")
        lines += ["| 32 requests, 16 at once, shared 500-word preamble | tok/s | TTFT p50 s |", "|---|---|---|",
                  f"| in-flight sharing (default) | {on['output_throughput']:.1f} | {on['ttft']['median']:.2f} |",
                  f"| without (`--prefix-wait-steps 0`) | {off['output_throughput']:.1f} | "
                  f"{off['ttft']['median']:.2f} |",
                  f"| ratio | {on['output_throughput'] / off['output_throughput']:.2f}x | "
                  f"{on['ttft']['median'] / off['ttft']['median']:.2f}x |", ""]
    if not args.skip_restart:
        t = restart(args.long_tokens, args.max_length)
        lines += [f"| {args.long_tokens}-token prompt | TTFT s | vs warm |", "|---|---|---|",
                  f"| cold (empty `--kv-cache-dir`) | {t['cold']:.2f} | {t['cold'] / t['warm']:.2f}x |",
                  f"| warm (in the device pool) | {t['warm']:.2f} | 1.00x |",
                  f"| after a restart (from `--kv-cache-dir`) | {t['disk']:.2f} | {t['disk'] / t['warm']:.2f}x |"]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
