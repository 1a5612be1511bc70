"""vSurge end to end on an accelerator: in-process and through `vsurge serve --uds` under the same load, and
how long `vsurge serve` takes to be ready, cold and from the compilation cache.

Every load sends N prompts at once (`vsurge bench serve`'s random words, the same seed on both sides),
`--input-len` tokens each, `--output-len` greedy tokens with the end token banned. In-process, the prompts
go to `vSurge.complete` in this process; through the server, `vsurge bench serve`'s client sends them
over a unix socket (the TPU machine here has no TCP at all) to `vsurge serve --uds` started with the same
engine flags. The server starts twice with one compilation cache folder, first empty: cold, then warm
(`--program-store`: three times, the last loading vsurge's program store; each start answers one greedy probe,
and the texts must agree).

    python benchmarks/tpu_serving.py --models 1b,default --concurrency 1,64            # in-process rows
    python benchmarks/tpu_serving.py --models default --concurrency 1,64 --serve       # and the server rows

Random models (1b, 3b: benchmarks/roofline.py's shapes, random bfloat16 weights) run in-process only:
the server loads files, and the default model is the file it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

import jax.numpy as jnp  # noqa: E402

import vsurge  # noqa: E402
from vsurge.cli import bench_serve  # noqa: E402
from vsurge.engine.engine_config import EngineConfig  # noqa: E402
from vsurge.loading import load_processor  # noqa: E402

ROW = "| {where} | {model} | {n} | {tok_s:,.0f} | {ttft:.3f} | {tpot:.1f} | {note} |"
HEADER = ("| where | model | concurrent | output tok/s | TTFT p50 s | TPOT p50 ms | note |\n"
          "|---|---|---|---|---|---|---|")


def prompts(n: int, input_len: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)  # what bench_serve.run sends with the same seed
    return [bench_serve.random_prompt(rng, input_len) for _ in range(n)]


def load_model(which: str):
    if which == "default":
        return vsurge.load("default", dtype=jnp.bfloat16, progress=False)[0], "default model (SmolLM2-135M)"
    import roofline

    model = roofline.random_llama(roofline.SHAPES[which])
    return model, model.config.name


async def one(surge, prompt: str, tokens: int, sampling: dict | None = None) -> tuple[float, float, int]:
    start, first, count = time.perf_counter(), None, 0
    request = vsurge.vSurgeRequest(prompt=prompt, max_tokens=tokens, ignore_eos=True,
                                   **{**(sampling or {}), "temperature": 0.0})
    async for samples in surge.complete(request):
        count += len(samples[0].token_ids)
        first = first or time.perf_counter()
    end = time.perf_counter()
    return first - start, (end - first) / max(count - 1, 1), count


async def level(surge, texts: list[str], tokens: int, sampling: dict | None = None) -> dict:
    start = time.perf_counter()
    results = await asyncio.gather(*(one(surge, t, tokens, sampling) for t in texts))
    wall = time.perf_counter() - start
    return {"tok_s": sum(r[2] for r in results) / wall, "ttft": statistics.median(r[0] for r in results),
            "tpot": 1e3 * statistics.median(r[1] for r in results)}


def in_process(which: str, processor, args) -> dict[int, dict]:
    model, name = load_model(which)
    config = EngineConfig(max_slots=max(args.concurrency), max_length=args.max_length)
    sampling = None
    if args.as_served:  # what `vsurge serve` adds: the host tier of the prefix cache, the model's sampling defaults
        from vsurge.kv.memory import default_host_cache_bytes
        from vsurge.loading import default_model_path
        from vsurge.loading.generation_config import resolve_generation_defaults

        config = config.replace(kv_host_cache_bytes=default_host_cache_bytes())
        defaults = resolve_generation_defaults("auto", default_model_path() if which == "default" else None)
        sampling = {k: v for k, v in defaults.as_dict().items() if k in ("repetition_penalty", "top_k", "top_p", "min_p")}
        print(f"{name}: as `vsurge serve` runs it: host tier {config.kv_host_cache_bytes / 2**30:.1f} GiB, "
              f"sampling {sampling}", flush=True)
    start = time.perf_counter()
    surge = vsurge.vSurge.from_config(model, processor, config)
    surge.compile()
    print(f"{name}: vSurge compiled in {time.perf_counter() - start:.0f} s "
          f"(attention backend {surge.engine.attention_backend}): {surge.engine.compile_summary}", flush=True)
    if surge.engine.deferred.active:  # the load is measured with every step program compiled
        surge.engine.deferred.wait()
        print(f"{name}: {len(surge.engine.deferred.futures)} programs compiled in the background in "
              f"{surge.engine.deferred.seconds:.0f} s more", flush=True)
    surge.start()
    out = {}
    try:
        asyncio.run(level(surge, prompts(2, 16, seed=99), 4))  # warm-up
        for n in args.concurrency:
            out[n] = asyncio.run(level(surge, prompts(n, args.input_len), args.output_len, sampling))
            print(ROW.format(where="in-process", model=name, n=n, note="", **out[n]), flush=True)
    finally:
        surge.stop()
    return out


def timestamped_log(stream, path: Path, start: float) -> None:
    """Copy the server's output to `path`, each line led by the seconds since its start (where start-up
    time goes: importing, the TPU runtime, loading, compiling)."""
    with open(path, "a") as log:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n").split("\r")[-1]  # a progress bar's last state
            log.write(f"[{time.perf_counter() - start:6.1f} s] {line}\n")
            log.flush()


def start_server(socket: str, cache: str, args, store: bool = False) -> tuple[subprocess.Popen, float]:
    """`vsurge serve --uds` with the in-process engine's flags; (process, seconds until /readiness said 200).
    store: with vsurge's program store on (VSURGE_PROGRAM_STORE=1: programs saved whole, loaded at a restart)."""
    cmd = [sys.executable, "-c", "import sys, vsurge.cli; sys.exit(vsurge.cli.main())", "serve", "--uds", socket, "--compilation-cache", cache,
           "--max-concurrent-decodes", str(max(args.concurrency)), "--max-length", str(args.max_length)]
    start = time.perf_counter()
    env = {**os.environ, "VSURGE_PROGRAM_STORE": "1" if store else "0"}
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    threading.Thread(target=timestamped_log, args=(server.stdout, Path(args.out) / "serve.log", start),
                     daemon=True).start()
    try:
        bench_serve.wait_ready("http://localhost", args.ready_timeout, uds=socket)
    except Exception:
        server.kill()
        raise
    return server, time.perf_counter() - start


def stop_server(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()


def print_compile_lines(out: str) -> None:
    """The server log's newest line on what its compile cost, by program and phase."""
    lines = (Path(out) / "serve.log").read_text(errors="replace").replace("\r", "\n").splitlines()
    for line in [line for line in lines if ": compiled " in line][-1:]:
        print("  server:", line, flush=True)


def wait_for_background_programs(out: str, timeout: float) -> float | None:
    """Wait until the newest server's log says its background compiles are done (the load is measured with
    every step program compiled) -> the seconds they took after ready (the server's word), or None (nothing compiled
    in the background)."""
    log, began = Path(out) / "serve.log", time.perf_counter()
    while time.perf_counter() - began < timeout:
        newest = log.read_text(errors="replace").split("Compiling ")[-1]  # (this start's part of the log)
        if "compile in the background" not in newest:
            return None
        done = re.search(r"background programs are compiled \(([\d.]+) s\)", newest)
        if done:
            return float(done.group(1))
        time.sleep(1)
    raise TimeoutError("the server's background programs did not compile in time")


GREEDY_PROBE = {"prompt": "The three largest cities of France are", "max_tokens": 24, "temperature": 0}


def greedy_text(socket: str) -> str:
    """One greedy completion: programs loaded from a store must answer what freshly compiled ones did."""
    model = bench_serve.first_model("http://localhost", None, uds=socket)
    with bench_serve.http_client(socket, timeout=120) as client:
        r = client.post("http://localhost/v1/completions", json={"model": model, **GREEDY_PROBE})
        r.raise_for_status()
        return r.json()["choices"][0]["text"]


def through_server(args) -> tuple[dict[int, dict], float, float]:
    """Starts: cold (empty cache; with --program-store its programs are stored too), from JAX's compilation
    cache, and with --program-store from vsurge's program store; the load runs on the last one."""
    socket, cache = tempfile.mktemp(suffix=".sock"), tempfile.mkdtemp(prefix="vsurge-cache-")
    starts = [("cold (empty compilation cache)", args.program_store), ("from the compilation cache", False)]
    if args.program_store:
        starts.append(("from vsurge's program store", True))
    texts, times = [], []
    for i, (what, store) in enumerate(starts):
        server, seconds = start_server(socket, cache, args, store)
        times.append(seconds)
        texts.append(greedy_text(socket))
        print(f"vsurge serve --uds: ready in {seconds:.1f} s {what}; greedy probe {texts[-1]!r}", flush=True)
        print_compile_lines(args.out)
        if i < len(starts) - 1:
            stop_server(server)
    background = wait_for_background_programs(args.out, args.ready_timeout)
    if background is not None:
        print(f"vsurge serve --uds: its background programs compiled in {background:.1f} s after it was ready",
              flush=True)
    if len(set(texts)) > 1:
        print("GREEDY TEXT DIFFERS between the starts (programs loaded from a store or a cache answer otherwise)",
              flush=True)
    cold, warm = times[0], times[-1]
    out = {}
    try:
        model = bench_serve.first_model("http://localhost", None, uds=socket)
        for n in args.concurrency:
            # one stream: four requests one after another (a single request's first token is one sample)
            s = asyncio.run(bench_serve.run("http://localhost", model, n if n > 1 else 4, args.input_len,
                                            args.output_len, float("inf"), n, None, args.eos_token_id, uds=socket))
            if s["failed"]:
                print(f"serve @ {n}: {s['failed']} failed: {s['errors']}", flush=True)
            out[n] = {"tok_s": s["output_throughput"], "ttft": s["ttft"]["median"], "tpot": 1e3 * s["tpot"]["median"]}
            print(ROW.format(where="serve --uds", model="default model (SmolLM2-135M)", n=n, note="", **out[n]),
                  flush=True)
            print(bench_serve.format_trace(s), flush=True)  # where the server's first token went
    finally:
        stop_server(server)
    return out, cold, warm


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="1b,default", help="any of 1b, 3b (random shapes) and default")
    p.add_argument("--concurrency", default="1,64", type=bench_serve.concurrency_levels)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-length", type=int, default=1024)
    p.add_argument("--serve", action="store_true", help="also the default model through `vsurge serve --uds`")
    p.add_argument("--ready-timeout", type=float, default=300)
    p.add_argument("--as-served", action="store_true",
                   help="in-process with what `vsurge serve` adds by default (the host tier, the model's sampling "
                        "defaults): the server's rows then differ by HTTP alone")
    p.add_argument("--program-store", action="store_true",
                   help="a third start, from vsurge's program store (VSURGE_PROGRAM_STORE=1)")
    p.add_argument("--eos-token-id", type=int, default=2, help="banned on the server side (the default model's)")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for serve.log")
    args = p.parse_args(argv)
    processor = load_processor("default")
    rows = []
    for which in filter(None, args.models.split(",")):  # --models "": the server alone
        for n, r in in_process(which, processor, args).items():
            rows.append(("in-process", which, n, r, ""))
    if args.serve:
        served, cold, warm = through_server(args)
        alone = {n: r for where, which, n, r, _ in rows if which == "default"}
        for n, r in served.items():
            note = f"{r['tok_s'] / alone[n]['tok_s']:.2f}x in-process" if n in alone else ""
            rows.append(("serve --uds", "default", n, r, note))
    print(f"\n`python benchmarks/tpu_serving.py {' '.join(argv if argv is not None else sys.argv[1:])}`, "
          f"{time.strftime('%Y-%m-%d')}, {args.input_len}-token prompts, {args.output_len} greedy tokens\n")
    print(HEADER)
    for where, which, n, r, note in rows:
        print(ROW.format(where=where, model=which, n=n, note=note, **r))
    if args.serve:
        print(f"\n`vsurge serve --uds` ready (process start to /readiness 200): {cold:.1f} s cold, {warm:.1f} s "
              f"from {'the program store' if args.program_store else 'the compilation cache'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
