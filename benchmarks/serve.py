"""Serving benchmark: vsurge's server and llama-cpp-python's server, same model, same load, one run.

Starts each server as a process on loopback, runs `vsurge bench serve` against
it (32 concurrent streams of 128 tokens from 128-token prompts by default) and
prints one markdown table. llama-cpp-python's server runs one request at a time.
A last vsurge row runs the same requests in-process, without HTTP: the server's overhead.
`--concurrency 1,16,32` runs one load per level on each server (that many prompts at once) and
`--plot FILE.png` draws tok/s and TTFT against concurrency, one line per server (vsurge.bench_plot).

    python benchmarks/serve.py [--num-prompts 32] [--input-len 128] [--output-len 128] [--skip offline,llama.cpp]
    python benchmarks/serve.py --concurrency 1,8,32 --plot serve.png
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from vsurge.bench_serve import (TABLE_HEADER, RequestResult, concurrency_levels, format_summary, random_prompt, run,
                                 summarize)
from vsurge.loading import default_model_path

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc, url: str, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.log_path.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(url)


def loads(args) -> list[tuple[int, int, float, int | None]]:
    """(concurrency, prompts, rate, max concurrency) of each load to run on every server."""
    if args.concurrency:
        return [(n, n, float("inf"), None) for n in args.concurrency]
    level = min(args.num_prompts, args.max_concurrency or args.num_prompts)
    return [(level, args.num_prompts, args.request_rate, args.max_concurrency)]


def row_name(name: str, level: int, args) -> str:
    return f"{name} @ {level}" if args.concurrency else name


def serve_and_bench(name, cmd, ready_path, args) -> list[tuple[int, dict]]:
    port = free_port()
    # the server's output goes to a file: an unread pipe fills up and blocks a chatty server
    log_file = tempfile.NamedTemporaryFile("w", prefix="serve-bench-", suffix=".log", delete=False)
    proc = subprocess.Popen([c.replace("{port}", str(port)) for c in cmd], env=ENV, stdout=log_file,
                            stderr=subprocess.STDOUT, text=True)
    proc.log_path = Path(log_file.name)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(proc, base + ready_path)
        model = httpx.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
        asyncio.run(run(base, model, 2, 16, 4, float("inf"), None, None, 2))  # warm-up
        points = []
        for level, num_prompts, rate, max_concurrency in loads(args):
            summary = asyncio.run(run(base, model, num_prompts, args.input_len, args.output_len, rate,
                                      max_concurrency, None, 2))
            print(format_summary(row_name(name, level, args), summary), flush=True)
            points.append((level, summary))
        return points
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def offline_bench(args, slots: int, length: int) -> list[tuple[int, dict]]:
    """The same requests through vSurge in this process (no HTTP): what the server should add little to."""
    import vsurge
    from vsurge import SamplingParams, vSurge

    model, processor = vsurge.load("default", progress=False)
    surge = vSurge.create_vdriver(model, processor, max_concurrent_decodes=slots, max_length=length,
                                  max_prefill_length=args.input_len * 2, prefill_lengths=[args.input_len * 2],
                                  max_queue=1024)
    surge.compile()
    surge.start()

    async def one(prompt, tokens):  # mirrors bench_serve.one_request: eos banned, greedy, streamed
        params = SamplingParams(max_tokens=tokens, temperature=0.0, logit_bias={2: -100.0})
        start, first, last, count, itls = time.perf_counter(), None, None, 0, []
        async for samples in surge.submit(processor.encode(prompt), params).updates():
            if samples[0].token_ids:
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    itls.append(now - last)
                last, count = now, count + len(samples[0].token_ids)
        return RequestResult(True, first - start, last - start, count, itls)

    async def load(n, input_len, tokens):
        rng = random.Random(0)  # the prompts bench_serve.run sends
        prompts = [random_prompt(rng, input_len) for _ in range(n)]
        start = time.perf_counter()
        results = await asyncio.gather(*(one(p, tokens) for p in prompts))
        return summarize(results, time.perf_counter() - start)

    points = []
    try:
        asyncio.run(load(2, 16, 4))  # warm-up
        for level, num_prompts, _, _ in loads(args):
            summary = asyncio.run(load(num_prompts, args.input_len, args.output_len))
            print(format_summary(row_name(f"vsurge f32 in-process, no HTTP ({slots} slots)", level, args), summary),
                  flush=True)
            points.append((level, summary))
    finally:
        surge.stop()
    return points


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--skip", default="", help="comma-separated: offline, llama.cpp")
    p.add_argument("--quantization", default="none,int8", help="vsurge runs ('' for none)")
    p.add_argument("--concurrency", type=concurrency_levels, default=None, metavar="N[,N...]",
                   help="one load per level, each N prompts at once (replaces --num-prompts)")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="tok/s and TTFT against concurrency")
    args = p.parse_args(argv)
    if args.concurrency and (args.request_rate != float("inf") or args.max_concurrency is not None):
        p.error("--concurrency sends each level's prompts at once: drop --request-rate and --max-concurrency")
    slots = max(level for level, *_ in loads(args))
    series: dict[str, list[tuple[int, dict]]] = {}
    length = args.input_len + args.output_len + 64
    requests = f"concurrency {args.concurrency}" if args.concurrency else f"{args.num_prompts} requests"
    print(f"\n{requests}, {args.input_len} prompt / {args.output_len} output tokens, "
          f"rate {args.request_rate}, max concurrency {args.max_concurrency or 'none'}\n")
    print(TABLE_HEADER)
    for q in filter(None, args.quantization.split(",")):
        cmd = [sys.executable, "-m", "vsurge.cli", "serve", "--port", "{port}", "--metrics-port", "-1",
               "--max-concurrent-decodes", str(slots), "--max-length", str(length), "--max-prefill-length",
               str(args.input_len * 2), "--prefill-lengths", str(args.input_len * 2), "--max-queue", "1024"]
        if q != "none":
            cmd += ["--quantization", q]
        name = f"vsurge {'f32' if q == 'none' else q} ({slots} slots)"
        series[name] = serve_and_bench(name, cmd, "/readiness", args)
    if "offline" not in args.skip and args.request_rate == float("inf") and args.max_concurrency is None:
        series["vsurge f32 in-process"] = offline_bench(args, slots, length)
    if "llama.cpp" not in args.skip:
        try:
            import llama_cpp.server  # noqa: F401
        except ImportError:
            print("(llama-cpp-python[server] is not installed)")
            return plot(series, args)
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(default_model_path()), "--host", "127.0.0.1",
               "--port", "{port}", "--n_threads", str(os.cpu_count()), "--n_ctx", "4096",
               "--interrupt_requests", "False"]  # by default a new request aborts the running one
        series["llama-cpp-python server (Q4_1)"] = serve_and_bench("llama-cpp-python server (Q4_1)", cmd,
                                                                   "/v1/models", args)
    return plot(series, args)


def plot(series, args) -> int:
    if args.plot:
        from vsurge.bench_plot import plot_summaries

        title = f"{args.input_len} prompt / {args.output_len} output tokens per request"
        print(f"\nplot: {plot_summaries(series, args.plot, title)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
