"""Where one engine step's time goes: JAX's profiler over real decode and prompt steps.

Prefills `rows` random 128-token prompts (`--prompt-len`) into the default engine (dense or paged),
then traces decode steps at that many rows (one step per call) and one prompt step
of `--prefill-tokens`, and splits each op's time by what it belongs to (the ops
carry the model's `named_scope`s): weight matmuls, attention (reads of the KV
pages and the dots), cache writes, the output head, sampling, other elementwise
work. The untraced wall time per call is split in proportion to each category's
traced op time (host work between calls is not in it: `benchmarks/serve.py` shows it).

    python benchmarks/profile_step.py [--model FILE] [--rows 1,16,32] [--engine paged] [--quantization int8]
                                      [--kv-cache-dtype bfloat16] [--top 20]
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import vsurge  # noqa: E402
from vsurge.engine.engine_config import EngineConfig  # noqa: E402
from vsurge.engine.request import ActiveRequest, ReturnChannel  # noqa: E402
from vsurge.engine.sequence import Sequence  # noqa: E402
from vsurge.sampling.params import SamplingParams  # noqa: E402

MATMUL_OPS = ("dot_general", "ffi_call")  # XLA's dots and the block kernel's custom call (GGUF blocks kept)
CATEGORIES = ("weight matmuls", "attention", "cache writes", "output head", "sampling", "elementwise")


def op_table(hlo_text: str) -> dict[str, tuple[str, str]]:
    """HLO instruction name -> (opcode, op_name metadata). An op XLA added (a copy, a YNNPACK dot fusion)
    has no op_name: it is named by its opcode and shape instead, e.g. "<fusion f32[16,64,128]>"."""
    table = {}
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+) ([\w\-]+)\(", line)
        if m:
            op = re.search(r'op_name="([^"]+)"', line)
            shape = re.sub(r"\{[^}]*\}", "", m.group(2))
            table[m.group(1)] = (m.group(3), op.group(1) if op else f"<{m.group(3)} {shape}>")
    return table


def category(opcode_and_name: tuple[str, str]) -> str:
    _, name = opcode_and_name
    leaf = name.rsplit("/", 1)[-1]
    if "/attention/" in name:
        return "cache writes" if leaf.startswith("scatter") else "attention"
    if "/layer_" in name:
        return "weight matmuls" if leaf.startswith(MATMUL_OPS) else "elementwise"
    if leaf.startswith(MATMUL_OPS):
        return "output head"
    if any(k in name for k in ("argmax", "top_k", "sort", "random", "threefry", "gumbel", "cumsum", "logsumexp",
                               "argsort", "/cond/")):
        return "sampling"
    return "elementwise"


def wall_ms(fn, reps: int) -> float:
    """Median ms per call, measured before any trace: once the profiler has run, every later call in
    the process is slower (which is also why each row count runs in its own process)."""
    fn()  # warm
    walls = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        walls.append((time.perf_counter() - start) * 1000)
    return float(np.median(walls))


def split(fn, hlo_text: str, reps: int, wall: float, top: int = 0) -> dict[str, float]:
    """`wall` split by category in proportion to each category's traced op time (the trace slows
    every op down, one event per thunk, so only the proportions are kept). `top`: also print the
    `top` op names (scopes, layer numbers folded) that take the most of it."""
    folder = tempfile.mkdtemp(prefix="vsurge-trace-")
    jax.profiler.start_trace(folder)
    for _ in range(reps):
        fn()
    jax.profiler.stop_trace()
    events = json.load(gzip.open(glob.glob(folder + "/**/*.json.gz", recursive=True)[0]))["traceEvents"]
    shutil.rmtree(folder, ignore_errors=True)
    table = op_table(hlo_text)
    traced, by_name = collections.Counter(), collections.Counter()
    for e in events:  # leaf ops only: a while loop's or a call's own event spans its body
        if e.get("ph") == "X" and e["name"] in table and table[e["name"]][0] not in ("while", "call", "conditional"):
            traced[category(table[e["name"]])] += e["dur"]
            by_name[re.sub(r"layer_\d+", "layer_N", table[e["name"]][1])] += e["dur"]
    total = sum(traced.values()) or 1.0
    for name, t in by_name.most_common(top):
        print(f"  {wall * t / total:7.2f} ms  {name}", flush=True)
    out = {c: wall * t / total for c, t in traced.items()}
    out["total"] = wall
    return out


def build(args, rows: int):
    model, processor = vsurge.load(args.model, quantization=args.quantization, progress=False)
    pages = -(-args.max_length // 128)  # the default page size
    config = EngineConfig(max_slots=max(rows, 2), max_length=args.max_length, decode_steps=1,
                          prefill_tokens=args.prefill_tokens,
                          num_pages=max(rows, 2) * pages if args.engine == "paged" else None,
                          kv_cache_dtype=args.kv_cache_dtype)
    engine_cls = (vsurge.oEngine if args.engine == "paged" else vsurge.vEngine)
    engine = engine_cls(model, processor, config=config)
    return engine, processor


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default", help="a GGUF file or checkpoint (default: the default model)")
    p.add_argument("--rows", default="1,16,32")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="every row's (the default model's served default is 1.2: its penalty path)")
    p.add_argument("--engine", default="paged", choices=["paged", "dense"])
    p.add_argument("--quantization", default=None)
    p.add_argument("--kv-cache-dtype", default=None, help="as `vsurge serve --kv-cache-dtype` (default: auto)")
    p.add_argument("--max-length", type=int, default=2048, help="the serving default: decode rows loop over "
                   "the page columns they use (512 and less: every column of the window, unrolled)")
    p.add_argument("--prefill-tokens", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=128, help="each prompt's tokens: the traced prompt step is "
                   "the first the scheduler plans for them (12 with --rows 32: a burst of short prompts)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--top", type=int, default=0, help="print the N op names taking the most time in each step")
    p.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    all_rows = [int(r) for r in args.rows.split(",")]
    if not args.no_header:
        from vsurge import kernels

        print(f"{args.model} model, {args.engine} engine, {args.quantization or 'load default'} weights, "
              f"{args.kv_cache_dtype or 'auto'} KV pages, "
              f"CPU ISA {kernels.cpu_isa()}, block kernel {kernels.variant() or 'unavailable'}; ms per call\n")
        print("| step | " + " | ".join(CATEGORIES) + " | total | tok/s |")
        print("|---|" + "---|" * (len(CATEGORIES) + 2), flush=True)
    if len(all_rows) > 1:  # one process per row count (see wall_ms)
        for rows in all_rows:
            forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]
            subprocess.run([sys.executable, __file__, *forwarded, "--rows", str(rows), "--no-header"], check=True)
        return 0
    rows = all_rows[0]
    rng = np.random.default_rng(0)
    engine, processor = build(args, rows)
    scheduler, state = engine.new_scheduler(), engine.init_state()
    for _ in range(rows):
        ids = rng.integers(100, 40000, args.prompt_len).tolist()
        params = SamplingParams(max_tokens=args.max_length - 200, temperature=0.0, ignore_eos=True,
                                repetition_penalty=args.repetition_penalty)
        request = ActiveRequest(ids, params, 0, args.max_length - 200, [], ReturnChannel())
        scheduler.add(Sequence.of(request, processor))
    prompt_plan = scheduler.schedule()
    engine.compile(progress=False)
    engine.deferred.wait()  # (an accelerator compiles some step programs after start-up)
    holder = {"state": state}

    def run(plan):
        holder["state"], out = engine.step(holder["state"], plan)
        jax.block_until_ready(out.tokens)
        return out

    prompt_wall = wall_ms(lambda: run(prompt_plan), 2)
    scheduler.postprocess(prompt_plan, run(prompt_plan).to_host(False))
    plan = scheduler.schedule()
    while plan.chunks:  # admit and prefill every prompt: then a plan is decode rows only
        scheduler.postprocess(plan, run(plan).to_host(False))
        plan = scheduler.schedule()
    assert len(plan.decode) == rows, (len(plan.decode), rows)
    decode_wall = wall_ms(lambda: run(plan), args.reps)
    d = next(n for n in engine.config.decode_rows if n >= len(plan.decode))
    w = next(x for x in engine.config.page_windows if x >= engine.batches.decode_window(plan))
    shape = prompt_plan.chunk_shape
    prompt_program = engine._program(("mixed", engine.config.mixed_rows(shape)[0], shape))
    if args.top:
        print("prompt step, the ops taking the most time:", flush=True)
    prompt = split(lambda: run(prompt_plan), prompt_program.as_text(), 1, prompt_wall, args.top)
    if args.top:
        print("decode step, the ops taking the most time:", flush=True)
    decode = split(lambda: run(plan), engine._program(("decode", d, w)).as_text(), 3, decode_wall, args.top)
    tokens = sum(c.length for c in prompt_plan.chunks)
    for name, cost, made in ((f"prompt, {tokens} tokens ({shape[0]} x {shape[1]})", prompt, tokens), (f"decode, {rows} rows", decode, rows)):
        cells = " | ".join(f"{cost.get(c, 0.0):.1f}" for c in CATEGORIES)
        print(f"| {name} | {cells} | {cost['total']:.1f} | {made / cost['total'] * 1000:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
