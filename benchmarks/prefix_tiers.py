"""Prefix-cache benchmark: in-flight sharing, and the disk tier across a restart (`vsurge serve`, default model).

1. Shared preamble: 32 requests, 16 at once, each a ~500-word preamble (the same for all) plus
   its own 128-word prompt, 128 greedy output tokens, streamed: with in-flight sharing (the
   default: a request waits for preamble pages another request is computing) and without it
   (`--prefix-wait-steps 0`). Prints tok/s and TTFT p50 of both and their ratios.
2. Restart: a long prompt (about `--long-tokens` tokens) to a server with an empty `--kv-cache-dir`
   (cold TTFT), again (warm: in the device pool), then the server restarts on the same directory
   and it is sent again (its pages come from disk: read into the pool at start-up, `--kv-prefetch-gb`),
   `--restarts` times. Prints the TTFTs (medians of the resends and restarts) and the ratios. The
   same against llama-server at its best: one slot with `--slot-save-path`, the prompt sent cold,
   again (its slot's cache), the slot saved, the server restarted, the slot restored, the prompt
   again. TTFT is a streamed request's first text, each from a fresh HTTP client, both servers alike.
3. Multi-turn: `--users` conversations of `--turns` turns each, all at once with `--concurrency`
   requests in the server at a time (users interleave), every turn resending a shared
   `--system-tokens` system prompt and the conversation so far (raw completions, greedy
   `--answer-tokens` answers), on a device pool of `--pages` pages, about a third of the working set
   (printed: the system prompt once plus every user's own history): with a host tier
   (`--kv-host-cache-gb`) and without (0, the CPU default): evicted history is copied back or
   recomputed. Prints TTFT p50 of the later turns and tok/s of both, and their ratios.

    python benchmarks/prefix_tiers.py [--skip-shared] [--skip-restart] [--skip-multiturn] [--skip-llama]

Run it alone on the machine (`flock /tmp/heavy.lock`): its numbers are wall-clock times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import Server, vsurge_cmd  # noqa: E402

from vsurge.cli.bench_serve import format_summary, random_prompt, run  # noqa: E402


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


def restart(tokens: int, max_length: int, restarts: int) -> dict:
    """TTFTs of the long prompt: cold, warm (median of `restarts` resends), and the first request
    after each of `restarts` restarts on the same --kv-cache-dir (their median)."""
    prompt = random_prompt(random.Random(7), tokens)
    with tempfile.TemporaryDirectory(prefix="vsurge-kv-") as kv_dir:
        extra = f"--kv-cache-dir {kv_dir} --max-length {max_length}"
        server = serve(extra)
        try:
            ttft(server, "Hello there")  # the first request after start-up pays its own costs
            cold = ttft(server, prompt)
            warm = statistics.median(ttft(server, prompt) for _ in range(restarts))
        finally:
            server.stop()
        disk = []
        for _ in range(restarts):
            server = serve(extra)
            try:
                disk.append(ttft(server, prompt))
            finally:
                server.stop()
    return {"cold": cold, "warm": warm, "disk": statistics.median(disk), "disk_all": disk}


def llama_restart(tokens: int, max_length: int, restarts: int) -> dict:
    """llama-server's best after a restart: its slot saved to --slot-save-path and restored (medians
    of `restarts` resends and restarts)."""
    from serve import llama_server_binary
    from vsurge.loading import default_model_path

    prompt = random_prompt(random.Random(7), tokens)
    with tempfile.TemporaryDirectory(prefix="llama-slots-") as slots:
        def start() -> Server:
            server = Server("llama-server", [llama_server_binary(), "-m", str(default_model_path()), "--host",
                                             "127.0.0.1", "--port", "{port}", "-np", "1", "-c", str(max_length),
                                             "-t", str(os.cpu_count() or 2), "--slot-save-path", slots], "/health")
            server.wait_ready()
            return server

        server = start()
        try:
            ttft(server, "Hello there")
            cold = ttft(server, prompt)
            warm = statistics.median(ttft(server, prompt) for _ in range(restarts))  # the slot holds the prompt
            httpx.post(server.base + "/slots/0?action=save", json={"filename": "prompt.bin"}, timeout=600).raise_for_status()
        finally:
            server.stop()
        restored = []
        for _ in range(restarts):
            server = start()
            try:
                httpx.post(server.base + "/slots/0?action=restore", json={"filename": "prompt.bin"},
                           timeout=600).raise_for_status()
                restored.append(ttft(server, prompt))
            finally:
                server.stop()
    return {"cold": cold, "warm": warm, "restored": statistics.median(restored), "restored_all": restored}


async def turn(client: httpx.AsyncClient, base: str, model: str, history: str, answer_tokens: int) -> tuple:
    """One streamed turn: (TTFT s, the answer's text)."""
    body = {"model": model, "prompt": history, "max_tokens": answer_tokens, "temperature": 0.0, "stream": True}
    start, first, text = time.perf_counter(), None, ""
    async with client.stream("POST", base + "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                piece = json.loads(line[6:])["choices"][0]["text"]
                if piece and first is None:
                    first = time.perf_counter() - start
                text += piece
    return first, text


def multiturn(args, host_gb: float) -> dict:
    """Every user's conversation runs at once, `--concurrency` requests in the server at a time (a
    request waits for a place; users interleave): between two turns of one user the others' turns
    pass through the pool, so its history has been evicted from the device pool by then."""
    server = serve(f"--max-length {args.multiturn_max_length} --num-pages {args.pages} --kv-host-cache-gb {host_gb} "
                   f"--max-concurrent-decodes {args.concurrency}")
    try:
        system = random_prompt(random.Random(3), args.system_tokens)
        model = server.model()
        ttfts, tokens, histories = [], [], {}

        async def all_users():
            limit = asyncio.Semaphore(args.concurrency)
            async with httpx.AsyncClient(timeout=3600) as client:
                async def conversation(user):
                    rng, history = random.Random(1000 + user), system
                    for t in range(args.turns):
                        history += f"\nUser: {random_prompt(rng, args.user_tokens)}\nAssistant:"
                        async with limit:
                            first, text = await turn(client, server.base, model, history, args.answer_tokens)
                        if t:  # a later turn: its history was computed before (device pool, host tier, or again)
                            ttfts.append(first)
                        tokens.append(args.answer_tokens)
                        history += text
                    histories[user] = history
                await asyncio.gather(*(conversation(u) for u in range(args.users)))

        start = time.perf_counter()
        asyncio.run(all_users())
        wall = time.perf_counter() - start
        stats = httpx.get(server.base + "/v1/stats", timeout=30).json()["models"][0]
        # the working set: the shared system prompt once, every user's own history after it
        count = lambda text: httpx.post(server.base + "/tokenize", json={"prompt": text}, timeout=60).json()["count"]
        shared = count(system)
        working = shared + sum(count(h) - shared for h in histories.values())
    finally:
        server.stop()
    out = {"ttft_p50": statistics.median(ttfts), "tok_s": sum(tokens) / wall, "wall": wall,
           "working_set_pages": working / args.page_size, "hits": stats.get("prefix_cache_hits"),
           "queries": stats.get("prefix_cache_queries"), "preemptions": stats.get("preemptions"),
           "tier_hits": stats.get("kv_tier_hits"), "swaps": stats.get("kv_swaps"),
           "server_ttft_p50": stats["ttft"]["p50"], "queue_p50": stats["queue_time"]["p50"], "steps": stats["steps"]}
    print(f"multi-turn, host tier {host_gb} GB: {out}", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip-shared", action="store_true")
    p.add_argument("--skip-restart", action="store_true")
    p.add_argument("--skip-multiturn", action="store_true")
    p.add_argument("--skip-llama", action="store_true", help="no llama-server restart comparison")
    p.add_argument("--long-tokens", type=int, default=4000, help="tokens (about) of the restart prompt")
    p.add_argument("--max-length", type=int, default=8192)
    p.add_argument("--restarts", type=int, default=3, help="restarts (and warm resends) whose TTFT medians count")
    p.add_argument("--users", type=int, default=32)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=4, help="multi-turn requests in the server at a time")
    p.add_argument("--system-tokens", type=int, default=2000)
    p.add_argument("--user-tokens", type=int, default=40, help="tokens (about) of each user message")
    p.add_argument("--answer-tokens", type=int, default=48)
    p.add_argument("--pages", type=int, default=54,
                   help="the device pool of the multi-turn load: about a third of the pages its working set takes")
    p.add_argument("--page-size", type=int, default=128, help="vsurge's page size (to count the working set)")
    p.add_argument("--multiturn-max-length", type=int, default=3072)
    p.add_argument("--host-gb", type=float, default=2.0, help="the host tier of the multi-turn load")
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
        t = restart(args.long_tokens, args.max_length, args.restarts)
        print(f"restart: {t}", flush=True)
        lines += [f"| {args.long_tokens}-token prompt | TTFT s | vs warm |", "|---|---|---|",
                  f"| cold (empty `--kv-cache-dir`) | {t['cold']:.3f} | {t['cold'] / t['warm']:.2f}x |",
                  f"| warm (in the device pool) | {t['warm']:.3f} | 1.00x |",
                  f"| after a restart (from `--kv-cache-dir`) | {t['disk']:.3f} | {t['disk'] / t['warm']:.2f}x |", ""]
        if not args.skip_llama:
            ll = llama_restart(args.long_tokens, args.max_length, args.restarts)
            print(f"llama-server restart: {ll}", flush=True)
            lines += [f"| {args.long_tokens}-token prompt | vsurge TTFT s | llama-server TTFT s | ratio |",
                      "|---|---|---|---|",
                      f"| cold | {t['cold']:.3f} | {ll['cold']:.3f} | {t['cold'] / ll['cold']:.2f}x |",
                      f"| warm (vsurge: device pool; llama-server: its slot) | {t['warm']:.3f} | {ll['warm']:.3f} | "
                      f"{t['warm'] / ll['warm']:.2f}x |",
                      f"| after a restart (vsurge: `--kv-cache-dir`; llama-server: slot saved and restored) | "
                      f"{t['disk']:.3f} | {ll['restored']:.3f} | {t['disk'] / ll['restored']:.2f}x |", ""]
    if not args.skip_multiturn:
        tier, none = multiturn(args, args.host_gb), multiturn(args, 0)
        lines += [f"| {args.users} users x {args.turns} turns, {args.concurrency} requests at once, "
                  f"{args.system_tokens}-token shared system prompt, {args.pages}-page pool, working set "
                  f"{tier['working_set_pages']:.0f} pages | TTFT p50 of later turns s | tok/s |",
                  "|---|---|---|",
                  f"| host tier ({args.host_gb} GB) | {tier['ttft_p50']:.2f} | {tier['tok_s']:.1f} |",
                  f"| no host tier (the CPU default) | {none['ttft_p50']:.2f} | {none['tok_s']:.1f} |",
                  f"| ratio | {tier['ttft_p50'] / none['ttft_p50']:.2f}x | {tier['tok_s'] / none['tok_s']:.2f}x |"]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
