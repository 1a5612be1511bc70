"""Where one engine step's time goes: JAX's profiler over real decode and prompt steps.

Prefills `rows` random 128-token prompts into the default engine (dense or paged),
then traces decode steps at that many rows (one step per call) and one prompt step
of `--prefill-tokens`, and splits each op's time by what it belongs to (the ops
carry the model's `named_scope`s): weight matmuls, attention (reads of the KV
pages and the dots), cache writes, the output head, sampling, other elementwise
work, and the host's share (wall time minus device ops).

    python benchmarks/profile_step.py [--rows 1,16,32] [--engine paged] [--quantization int8]
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
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import vsurge  # noqa: E402
from vsurge.engine.config import EngineConfig  # noqa: E402
from vsurge.engine.request import ActiveRequest, ReturnChannel  # noqa: E402
from vsurge.engine.sequence import Sequence  # noqa: E402
from vsurge.sampling_params import SamplingParams  # noqa: E402

CATEGORIES = ("weight matmuls", "attention", "cache writes", "output head", "sampling", "elementwise", "host")


def op_table(hlo_text: str) -> dict[str, tuple[str, str]]:
    """HLO instruction name -> (opcode, op_name metadata)."""
    table = {}
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = \S+ ([\w\-]+)\(", line)
        if m:
            op = re.search(r'op_name="([^"]+)"', line)
            table[m.group(1)] = (m.group(2), op.group(1) if op else "")
    return table


def category(opcode_and_name: tuple[str, str]) -> str:
    _, name = opcode_and_name
    leaf = name.rsplit("/", 1)[-1]
    if "/attention/" in name:
        return "cache writes" if leaf.startswith("scatter") else "attention"
    if "/layer_" in name:
        return "weight matmuls" if leaf.startswith("dot_general") else "elementwise"
    if leaf.startswith("dot_general"):
        return "output head"
    if any(k in name for k in ("argmax", "top_k", "sort", "random", "threefry", "gumbel", "cumsum", "logsumexp",
                               "argsort", "/cond/")):
        return "sampling"
    return "elementwise"


def profile(fn, hlo_text: str, reps: int) -> dict[str, float]:
    """ms per call by category (mean over reps)."""
    folder = tempfile.mkdtemp(prefix="vsurge-trace-")
    fn()  # warm
    jax.profiler.start_trace(folder, create_perfetto_trace=True)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    wall = (time.perf_counter() - start) / reps * 1000
    jax.profiler.stop_trace()
    events = json.load(gzip.open(glob.glob(folder + "/**/*.json.gz", recursive=True)[0]))["traceEvents"]
    shutil.rmtree(folder, ignore_errors=True)
    table = op_table(hlo_text)
    out = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e["name"] in table:
            out[category(table[e["name"]])] += e["dur"] / 1000 / reps
    out["host"] = max(0.0, wall - sum(out.values()))
    out["total"] = wall
    return out


def build(args, rows: int):
    model, processor = vsurge.load("default", quantization=args.quantization, progress=False)
    config = EngineConfig(max_slots=max(rows, 2), max_length=args.max_length, decode_steps=1,
                          prefill_tokens=args.prefill_tokens, num_pages=max(rows, 2) * 4 if args.engine == "paged"
                          else None)
    engine_cls = (vsurge.oEngine if args.engine == "paged" else vsurge.vEngine)
    engine = engine_cls(model, processor, config=config)
    return engine, processor


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,16,32")
    p.add_argument("--engine", default="paged", choices=["paged", "dense"])
    p.add_argument("--quantization", default=None)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--prefill-tokens", type=int, default=512)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"default model, {args.engine} engine, {args.quantization or 'bfloat16'} weights; ms per call\n")
    print("| step | " + " | ".join(CATEGORIES) + " | total | tok/s |")
    print("|---|" + "---|" * (len(CATEGORIES) + 2))
    for rows in [int(r) for r in args.rows.split(",")]:
        engine, processor = build(args, rows)
        scheduler, state = engine.new_scheduler(), engine.init_state()
        for _ in range(rows):
            ids = rng.integers(100, 40000, 128).tolist()
            request = ActiveRequest(ids, SamplingParams(max_tokens=args.max_length - 200, temperature=0.0,
                                                        ignore_eos=True), 0, args.max_length - 200, [], ReturnChannel())
            scheduler.add(Sequence.of(request, processor))
        prompt_plan = scheduler.schedule()
        engine.compile(progress=False)
        holder = {"state": state}

        def run(plan):
            holder["state"], out = engine.step(holder["state"], plan)
            jax.block_until_ready(out.tokens)
            return out

        key = ("mixed", 0, prompt_plan.chunk_shape)
        prompt = profile(lambda: run(prompt_plan), engine._program(key).as_text(), 1)
        out = run(prompt_plan)
        scheduler.postprocess(prompt_plan, out.to_host(False))
        while any(s.remaining > 1 for s in scheduler.running):  # finish prefilling every prompt
            plan = scheduler.schedule()
            scheduler.postprocess(plan, run(plan).to_host(False))
        plan = scheduler.schedule()
        d = next(n for n in engine.config.decode_rows if n >= len(plan.decode))
        w = next(x for x in engine.config.page_windows if x >= engine.batches.decode_window(plan))
        decode = profile(lambda: run(plan), engine._program(("decode", d, w)).as_text(), args.reps)
        tokens = sum(c.length for c in prompt_plan.chunks)
        for name, cost, made in ((f"prompt, {tokens} tokens", prompt, tokens), (f"decode, {rows} rows", decode, rows)):
            cells = " | ".join(f"{cost[c]:.1f}" for c in CATEGORIES)
            print(f"| {name} | {cells} | {cost['total']:.1f} | {made / cost['total'] * 1000:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
