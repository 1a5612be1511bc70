"""On a machine with GPUs or TPUs: the model checks and the serving benchmark, sharded over every local device.

    python benchmarks/scale_accelerator.py                    # checks, then serving at 1, 8, 16, 32 streams
    python benchmarks/scale_accelerator.py --skip-tests --concurrency 1,32

1. model checks: the repository's model tests (tests/loading/test_default_model.py and
   tests/models/test_models_vs_transformers.py) on the accelerator, then the default model in
   bfloat16 at tensor parallelism over the local devices against one device (logits and
   32 greedy tokens; bfloat16 sums in another order, so the table reports rather than asserts);
2. vInference on one device, bfloat16: the greedy reply to "What is the capital of France?"
   (is the output sane there?) and single-stream decode tok/s measured as
   benchmarks/vinference.py does (128 new tokens minus the first, medians of 3);
3. serving: `vsurge serve --dtype bfloat16` with the largest tensor-parallel size that divides
   the model's 9 query heads and fits the devices (3 on 4 or 8 GPUs), data-parallel replicas
   on the rest, loaded by `vsurge bench serve` (128-token prompts and outputs, greedy, end
   token banned; 1 stream is 4 requests one after another, as benchmarks/serve.py does),
   printed as docs/performance.md's vSurge table with the device in the first column.

benchmarks/gpu_session.sh runs it on a borrowed one-GPU machine (docs/performance.md, GPU / TPU).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent
QUERY_HEADS = 9  # the default model (SmolLM2-135M): tensor-parallel sizes must divide it


def parallel_sizes(devices: int) -> tuple[int, int]:
    """(tensor, data) parallel sizes for the default model on `devices` devices."""
    tp = max(t for t in range(1, devices + 1) if QUERY_HEADS % t == 0)
    return tp, devices // tp


def run_model_tests(platform: str) -> int:
    # the tests compare float32 logits with torch's float32 at 2e-3: JAX's default float32 matmul
    # precision on GPU is lower (TF32-like; 0.083 max logit difference on an H200, 2026-11-30),
    # "highest" passes there
    env = {**os.environ, "JAX_PLATFORMS": platform, "HF_HUB_OFFLINE": "1",
           "JAX_DEFAULT_MATMUL_PRECISION": "highest"}
    cmd = [sys.executable, "-m", "pytest", "-q", "tests/loading/test_default_model.py", "tests/models/test_models_vs_transformers.py"]
    print("$", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT, env=env)


def tensor_parallel_check(tp: int) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    import vsurge
    sys.path.insert(0, str(ROOT / "tests"))  # the reference Generator (tests/dense_generator.py)
    from dense_generator import greedy_generate

    def forward(model, ids):
        graphdef, state = nnx.split(model)
        return np.asarray(jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0][0])(state, jnp.asarray([ids], jnp.int32)))

    one, processor = vsurge.load("default", dtype="bfloat16", progress=False)
    ids = processor.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    ref_logits, ref_tokens = forward(one, ids), greedy_generate(one, ids, 32)
    sharded, _ = vsurge.load("default", dtype="bfloat16", progress=False, load_processor=False,
                             tensor_parallel_size=tp)
    logits, tokens = forward(sharded, ids), greedy_generate(sharded, ids, 32)
    same = next((i for i, (a, b) in enumerate(zip(ref_tokens, tokens)) if a != b), len(tokens))
    err = float(np.abs(logits - ref_logits).max() / np.abs(ref_logits).max())
    print(f"\n| check (bfloat16, TP {tp} vs 1 device) | value |\n|---|---|\n"
          f"| max logit difference / max logit | {err:.2e} |\n"
          f"| next-token argmax agreement | {float((logits.argmax(-1) == ref_logits.argmax(-1)).mean()):.3f} |\n"
          f"| greedy tokens identical before the first difference | {same} / 32 |\n"
          f"| text at TP {tp} | {processor.decode(tokens)!r} |\n", flush=True)


def vinference_check(tokens: int, reps: int) -> None:
    """The default model in bfloat16 on one device: a greedy reply, then single-stream decode speed
    as benchmarks/vinference.py measures it (decode excludes the prefill: 128 tokens minus 1)."""
    sys.path.insert(0, str(HERE))
    from common import single_stream_decode  # benchmarks/common.py

    import jax

    import vsurge
    from vsurge import SamplingParams, vInference, vInferenceConfig

    start = time.perf_counter()
    model, processor = vsurge.load("default", dtype="bfloat16", progress=False)
    print(f"default model loaded in bfloat16 on {jax.devices()[0].device_kind} in {time.perf_counter() - start:.1f} s",
          flush=True)
    vi = vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=tokens))
    start = time.perf_counter()
    reply = vi.process_prompt([{"role": "user", "content": "What is the capital of France?"}],
                              SamplingParams(max_tokens=min(32, tokens), temperature=0.0))
    print(f"greedy reply ({time.perf_counter() - start:.1f} s, compilation included): {reply.text!r}", flush=True)
    decode, full, first = single_stream_decode(vi, tokens, reps)
    print(f"\n| vInference, bfloat16, 1 stream, {tokens} new tokens, medians of {reps} | value |\n|---|---|\n"
          f"| decode tok/s (prefill excluded) | {decode:.1f} |\n"
          f"| whole request s | {full:.3f} |\n| first token s | {first:.3f} |\n", flush=True)


def serve_and_bench(device: str, tp: int, dp: int, levels: list[int], input_len: int, output_len: int,
                    server_log: str | None) -> None:
    sys.path.insert(0, str(HERE))
    from serve import Server  # benchmarks/serve.py

    from vsurge.cli.bench_serve import run

    slots = max(levels)
    cmd = [sys.executable, "-m", "vsurge.cli", "serve", "--dtype", "bfloat16", "--port", "{port}",
           "--metrics-port", "-1", "--tensor-parallel-size", str(tp), "--data-parallel-size", str(dp),
           "--max-concurrent-decodes", str(max(1, slots // dp)), "--max-length", str(input_len + output_len + 64),
           "--max-prefill-length", str(input_len * 2), "--prefill-lengths", str(input_len * 2), "--max-queue", "1024"]
    print("$", " ".join(cmd), flush=True)
    server = Server("vsurge", cmd, "/readiness")
    try:
        print(f"vsurge serve ready in {server.wait_ready():.1f} s", flush=True)
        model = server.model()
        asyncio.run(run(server.base, model, 2, 16, 4, float("inf"), None, None, 2))  # warm-up
        print(f"\nvSurge (paged), default model, bfloat16, TP {tp} x DP {dp}, {input_len}-word prompts, "
              f"{output_len} streamed tokens per request, all requests at once (1 stream: 4 in turn)\n")
        print("| device | weights | concurrent | output tok/s | TTFT p50 s | TTFT p99 s | TPOT p50 ms "
              "| output tokens |\n|---|---|---|---|---|---|---|---|", flush=True)
        for n in levels:
            prompts = 4 if n == 1 else n
            s = asyncio.run(run(server.base, model, prompts, input_len, output_len, float("inf"), n, None, 2))
            print(f"| {device} | bfloat16 | {n} | {s['output_throughput']:.1f} | {s['ttft']['median']:.2f} | "
                  f"{s['ttft']['p99']:.2f} | {s['tpot']['median'] * 1000:.0f} | "
                  f"{s['output_throughput'] * s['duration_s']:.0f} |", flush=True)
            if s["failed"]:
                print(f"({s['failed']} of {prompts} requests failed: {s['errors']})", flush=True)
    finally:
        server.stop()
        if server_log:
            shutil.copyfile(server.log.name, server_log)


def local_devices() -> tuple[str, int, str]:
    """(platform, count, kind) of the local devices, asked in a child process: JAX in this one
    would take the accelerators' memory (XLA preallocates it) from the server started later."""
    code = "import jax; d = jax.local_devices(); print(d[0].platform, len(d), d[0].device_kind, sep='|')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    platform, count, kind = out.strip().splitlines()[-1].split("|")
    return platform, int(count), kind


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="1,8,16,32")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--server-log", default=None, help="copy the server's output to this file")
    p.add_argument("--tp-check", type=int, default=None, help=argparse.SUPPRESS)  # the child of step 1
    p.add_argument("--vinference-check", action="store_true", help=argparse.SUPPRESS)  # the child of step 2
    args = p.parse_args(argv)
    if args.tp_check:
        tensor_parallel_check(args.tp_check)
        return 0
    if args.vinference_check:
        vinference_check(args.output_len, 3)
        return 0
    platform, count, kind = local_devices()
    if platform == "cpu":
        print("no GPU or TPU visible: this script is for accelerator machines (CPU numbers are in docs/performance.md)")
        return 1
    tp, dp = parallel_sizes(count)
    device = f"{count} x {kind}"
    print(f"{device}: tensor parallel {tp}, data parallel {dp}", flush=True)
    start = time.time()
    if not args.skip_tests:
        if run_model_tests(platform) != 0:
            print("model tests failed", flush=True)
        if tp > 1:
            subprocess.call([sys.executable, __file__, "--tp-check", str(tp)])
    # a child process each: JAX here would take the accelerators' memory from the server started later
    if subprocess.call([sys.executable, __file__, "--vinference-check", "--output-len", str(args.output_len)]):
        print("vInference check failed", flush=True)
    serve_and_bench(device, tp, dp, [int(n) for n in args.concurrency.split(",")], args.input_len, args.output_len,
                    args.server_log)
    print(f"\n({time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
