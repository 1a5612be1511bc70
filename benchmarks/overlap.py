"""The overlapped step loop against the plain one: `vsurge serve` with and without `--no-async-scheduling`.

Both servers run at once (an idle vsurge uses no CPU), each load alternates between them
and repeats `--rounds` times, so both see the same machine; the table gives the medians.
Loads as benchmarks/serve.py's: 128-word random prompts, 128 greedy output tokens
(end token banned), streamed; "1 stream" is 4 requests one after another, "32 concurrent"
32 at once.

    python benchmarks/overlap.py [--rounds 3] [--vsurge-args "--decode-steps 4"]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from serve import Server, vsurge_cmd

from vsurge.cli.bench_serve import run
from vsurge.kernels import cpu_isa

LOADS = [("1 stream", 4, 1), ("32 concurrent", 32, 32)]  # (name, prompts, concurrency)
SERVERS = [("overlapped", ""), ("not overlapped", "--no-async-scheduling")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--vsurge-args", default="--num-pages 256", help="extra `vsurge serve` flags for both")
    args = p.parse_args(argv)
    servers = {}
    for name, flag in SERVERS:  # one after the other: the first fills the compilation cache
        server = Server(name, vsurge_cmd(f"{args.vsurge_args} {flag}"), "/readiness")
        print(f"{name}: ready in {server.wait_ready():.1f} s", flush=True)
        servers[name] = server
    tok = {(s, load): [] for s in servers for load, *_ in LOADS}
    try:
        models = {name: server.model() for name, server in servers.items()}
        for name, server in servers.items():  # the first request after start-up is not measured
            asyncio.run(run(server.base, models[name], 1, args.input_len, 16, float("inf"), 1, None, 2, seed=99))
        for r in range(args.rounds):
            for load, prompts, concurrency in LOADS:
                order = list(servers) if r % 2 == 0 else list(reversed(servers))
                for name in order:
                    summary = asyncio.run(run(servers[name].base, models[name], prompts, args.input_len,
                                              args.output_len, float("inf"), concurrency, None, 2, seed=r))
                    tok[(name, load)].append(summary["output_throughput"])
                    print(f"round {r + 1} {load} {name}: {summary['output_throughput']:.1f} tok/s "
                          f"({summary['failed']} failed)", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    command = "python benchmarks/overlap.py" + (f" --rounds {args.rounds}" if args.rounds != 3 else "")
    print(f"\n`{command}`, default model, CPU ISA {cpu_isa()}, {time.strftime('%Y-%m-%d')}, "
          f"medians of {args.rounds} alternating rounds\n")
    print("| load | overlapped tok/s | not overlapped tok/s | ratio |\n|---|---|---|---|")
    for load, *_ in LOADS:
        on, off = (statistics.median(tok[(s, load)]) for s in servers)
        print(f"| {load} | {on:.1f} | {off:.1f} | {on / off:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
