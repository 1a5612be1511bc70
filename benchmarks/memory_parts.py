"""Peak and steady resident memory of `vsurge serve` beside `llama-server` on one GGUF file, with vsurge's own
breakdown (issue 60 item 1): where the memory goes, read from `/v1/stats`' `memory` object.

Each server runs alone, is sent a short load (8 concurrent requests, 64-word prompts, 64 greedy tokens: the
serving buffers count too), and is then read from /proc/PID/status: VmHWM (peak) and VmRSS (steady). Both
servers hold the same KV tokens: vsurge with `--max-concurrent-decodes SLOTS --max-length CTX/SLOTS`'s pool
(its default flags give 32 x 2048 = 65,536), llama-server with `-np NP -c CTX`.

    python benchmarks/memory_parts.py [--model FILE] [--np 8] [--ctx 65536] [--vsurge-args "..."] [--skip-llama]

Without --model: the default model's file. Run with PYTHONPATH pointing at another checkout's src to measure
that code (the "before" of a change).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import httpx  # noqa: E402
from serve import Server, isa_line, llama_server_binary, vsurge_cmd  # noqa: E402

from vsurge.cli.bench_serve import run  # noqa: E402
from vsurge.loading import default_model_path  # noqa: E402

GiB = 2**30


def status_kib(pid: int) -> dict[str, int]:
    """/proc/PID/status' memory lines (VmHWM, VmRSS, RssAnon, RssFile), KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0])
    return out


def measure(server: Server) -> dict:
    at_ready = status_kib(server.proc.pid)
    model = server.model()
    summary = asyncio.run(run(server.base, model, 8, 64, 64, float("inf"), 8, None, 2, seed=5))
    served = status_kib(server.proc.pid)
    memory = None
    if server.name == "vsurge":
        stats = httpx.get(server.base + "/v1/stats", timeout=30).json()
        memory = stats.get("memory")
    return {"ready": at_ready, "served": served, "failed": summary["failed"], "memory": memory}


def gib(kib: int) -> str:
    return f"{kib / 2**20:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a GGUF file (default: the default model's)")
    p.add_argument("--np", type=int, default=8, help="llama-server's parallel slots")
    p.add_argument("--ctx", type=int, default=65536, help="llama-server's -c: the KV tokens of both servers")
    p.add_argument("--vsurge-args", default="", help="extra `vsurge serve` flags")
    p.add_argument("--skip-llama", action="store_true")
    args = p.parse_args(argv)
    file = Path(args.model) if args.model else default_model_path()
    print(f"{isa_line()}\n{file} ({file.stat().st_size / GiB:.2f} GiB)", flush=True)
    vsurge = Server("vsurge", vsurge_cmd(f"--model {shlex.quote(str(file))} {args.vsurge_args}"), "/readiness")
    print(f"vsurge ready in {vsurge.wait_ready(3600):.1f} s", flush=True)
    try:
        results = {"vsurge": measure(vsurge)}
    finally:
        vsurge.stop()
    if not args.skip_llama:
        llama = Server("llama-server", [llama_server_binary(), "-m", str(file), "--host", "127.0.0.1", "--port",
                                        "{port}", "-np", str(args.np), "-c", str(args.ctx), "-t",
                                        str(os.cpu_count() or 2)], "/health")
        llama.wait_ready()
        try:
            results["llama-server"] = measure(llama)
        finally:
            llama.stop()
    print(json.dumps(results, indent=1))
    print("\n| server | peak RSS GiB | RSS at ready GiB | RSS after the load GiB |\n|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {gib(r['served']['VmHWM'])} | {gib(r['ready']['VmRSS'])} | {gib(r['served']['VmRSS'])} |")
    memory = results["vsurge"]["memory"]
    if memory:  # (a checkout from before /v1/stats had `memory` has none)
        parts = {**memory["parts"], "unattributed": memory["unattributed"]}
        print("\nvsurge's parts (GiB): " + ", ".join(f"{k} {v / GiB:.2f}" for k, v in parts.items() if v is not None)
              + f"; peak reached: {memory['peak_reached_while']}; transients (GiB): "
              + ", ".join(f"{k} {v / GiB:.2f}" for k, v in memory["transients"].items()))
    if "llama-server" in results:
        ratio = results["vsurge"]["served"]["VmHWM"] / results["llama-server"]["served"]["VmHWM"]
        print(f"\npeak RSS ratio vsurge / llama-server: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
