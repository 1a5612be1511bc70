"""Decode step time against the memory roofline, and prefill MFU, on whatever device JAX has.

Models: random bfloat16 weights at Llama-3.1-8B's shape (16 GB: 32 layers, 4096 wide, 32 query
and 8 KV heads, 128k vocabulary), the 3B and 1B shapes, the default model (SmolLM2-135M, bfloat16), and
`hybrid`: benchmarks/hybrid_decode.py's ~0.5B Qwen3.5 shape (three Gated DeltaNet layers to one attention
layer) beside the dense model of its parameter count, both computing in bfloat16. For each
stream count (1/16/64/256), that many `--prompt-len`-token prompts are prefilled into the paged
engine (one decode step per call), then the same decode step runs `--reps` times:

    step ms       median device time of one decode step (block_until_ready)
    roofline ms   bytes the step must read / the device's memory bandwidth: every weight once
                  (the output head included, the input embedding table not: rows are gathered)
                  plus each row's K/V pages up to its position, plus each row's recurrent states read
                  and written once (hybrids)
    % roofline    roofline / step

and one prompt step of `--prefill-tokens` tokens gives prefill TFLOP/s (2 x weights x tokens +
causal attention) and MFU against the device's dense bfloat16 peak. Bandwidth and peak come from
the device kind (H100/H200/A100/TPU v4-v6e; `--bandwidth-gbs`/`--peak-tflops` override); on CPU
the bandwidth is measured (a jitted reduction over 0.5 GB) and MFU is left out.

    python benchmarks/roofline.py                       # on the accelerator: both models, 1/16/64/256
    python benchmarks/roofline.py --smoke               # on CPU: tiny 8B-shaped model, 1 and 4 streams
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import vsurge  # noqa: E402
from vsurge.config import ModelConfig, Rope  # noqa: E402
from vsurge.engine.engine_config import EngineConfig  # noqa: E402
from vsurge.engine.request import ActiveRequest, ReturnChannel  # noqa: E402
from vsurge.engine.sequence import Sequence  # noqa: E402
from vsurge.kernels import cpu_isa  # noqa: E402
from vsurge.kv.recurrent import stored_row_bytes  # noqa: E402
from vsurge.models.families.llama import Llama  # noqa: E402
from vsurge.ops.linear import quantize_int8  # noqa: E402
from vsurge.sampling.params import SamplingParams  # noqa: E402

LLAMA_8B = dict(architecture="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, max_position_embeddings=131072,
                rope=Rope(kind="llama3", theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192), name="random Llama-3.1-8B shape")
LLAMA_1B = dict(LLAMA_8B, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32, num_kv_heads=8,
                head_dim=64, tie_word_embeddings=True, name="random Llama-3.2-1B shape")
LLAMA_3B = dict(LLAMA_8B, hidden_size=3072, intermediate_size=8192, num_layers=28, num_heads=24, num_kv_heads=8,
                head_dim=128, tie_word_embeddings=True, name="random Llama-3.2-3B shape")
SMOKE_8B = dict(LLAMA_8B, hidden_size=256, intermediate_size=896, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=64, vocab_size=8192, name="tiny 8B-shaped (smoke)")
# device kind (substring) -> (memory GB/s, dense bfloat16 TFLOP/s)
DEVICES = {"H200": (4800, 989), "H100": (3350, 989), "A100": (2039, 312), "L4": (300, 121),
           "TPU v6": (1640, 918), "TPU v5p": (2765, 459), "TPU v5": (819, 197), "TPU v4": (1200, 275)}


SHAPES = {"8b": LLAMA_8B, "3b": LLAMA_3B, "1b": LLAMA_1B}


def device_limits(args) -> tuple[float, float | None, str]:
    device = jax.devices()[0]
    kind = getattr(device, "device_kind", device.platform)
    bandwidth, peak = next((v for k, v in DEVICES.items() if k.lower() in kind.lower()), (None, None))
    if args.bandwidth_gbs:
        bandwidth = args.bandwidth_gbs
    if args.peak_tflops:
        peak = args.peak_tflops
    if bandwidth is None:  # CPU or an unknown device: measure reads
        x = jnp.ones((int(0.5e9 / 4),), jnp.float32)
        total = jax.jit(jnp.sum)
        total(x).block_until_ready()
        walls = []
        for _ in range(5):
            start = time.perf_counter()
            total(x).block_until_ready()
            walls.append(time.perf_counter() - start)
        bandwidth = 0.5e9 / min(walls) / 1e9
        kind += f" (bandwidth measured; CPU ISA {cpu_isa()})" if device.platform == "cpu" else " (bandwidth measured)"
    return bandwidth * 1e9, (peak * 1e12 if peak else None), kind


def random_llama(fields: dict, quantization: str | None = None):
    """Random bfloat16 weights at a Llama shape; with quantization="int8", its matrices and head as int8 with
    per-channel scales (models/parts/base.quantize's result), made one matrix at a time: the 8B shape's 16 GB of
    bfloat16 never exists at once, so it fits one 16 GB chip."""
    config = ModelConfig(**fields)
    build = lambda: Llama(config, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))  # noqa: E731
    if quantization is None:
        return build()
    if quantization != "int8":
        raise SystemExit(f"--quantization {quantization}: only int8 is built here")
    model = nnx.eval_shape(build)  # shapes only
    keys = iter(jax.random.split(jax.random.key(0), 16 * (config.num_layers + 2)))

    def fill(holder, quantized=()):
        for name, value in list(vars(holder).items()):
            if isinstance(value, nnx.Param) and isinstance(value.get_value(), jax.ShapeDtypeStruct):
                like = value.get_value()
                w = (jax.random.normal(next(keys), like.shape, jnp.float32) * 0.02).astype(like.dtype)
                if name in quantized:
                    w, scale = quantize_int8(w)
                    setattr(holder, name + "_scale", nnx.Param(scale))
                value.set_value(w)

    for i, layer in enumerate(model.layers):
        fill(layer, {n for n, spec in Llama.layer_weights(config, i).items() if spec.quantize})
    fill(model, {"lm_head"})
    if not hasattr(model, "lm_head"):  # a tied head: quantize() keeps the float embedding for lookups
        model.lm_head, model.lm_head_scale = (nnx.Param(a) for a in quantize_int8(model.embed[...].T))
    left = [p for p, x in jax.tree_util.tree_leaves_with_path(nnx.state(model)) if isinstance(x, jax.ShapeDtypeStruct)]
    assert not left and model.quantization == "int8", (left, model.quantization)
    return model


def weight_bytes(model) -> tuple[int, int]:
    """(bytes a decode step reads, parameters in the matmuls of one token: the step's flops / 2)."""
    params = nnx.state(model, nnx.Param)
    leaves = jax.tree_util.tree_leaves_with_path(params)
    total = sum(x.size * x.dtype.itemsize for _, x in leaves)
    count = sum(x.size for _, x in leaves)
    embed = next((x for path, x in leaves if "embed" in jax.tree_util.keystr(path)), None)
    if embed is not None and (not model.config.tie_word_embeddings or hasattr(model, "lm_head")):
        # gathered rows only, never read whole (a quantized tied head is its own int8 copy)
        total -= embed.size * embed.dtype.itemsize
        count -= embed.size
    return total, count


def kv_bytes_per_token(model) -> int:
    return sum(l.heads * (l.k_dim + l.v_dim) for l in model.config.kv_layout) * 2  # bfloat16 pages


def trace(folder: str, fn, calls: int = 3) -> None:
    """A perfetto trace of `calls` calls of fn into folder (benchmarks/trace_summary.py sums it by op)."""
    jax.profiler.start_trace(folder, create_perfetto_trace=True)
    for _ in range(calls):
        fn()
    jax.profiler.stop_trace()


def timed(fn, reps: int) -> float:
    fn()
    walls = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - start)
    return statistics.median(walls)


def measure_what_fits(name, model, processor, streams: list[int], args, bandwidth, peak) -> list[str]:
    """measure(), dropping the most streams while an engine sized for them does not fit the device (the 3B shape
    at 256 streams: its KV alone is more than a v5e's HBM), so the smaller counts are still measured."""
    rows, streams = [], sorted(streams)
    while streams:
        try:
            return rows + measure(name, model, processor, streams, args, bandwidth, peak)
        except Exception as error:  # noqa: BLE001 (jax's runtime error; anything else is raised again)
            if "RESOURCE_EXHAUSTED" not in str(error):
                raise
            why = str(error).split("RESOURCE_EXHAUSTED:", 1)[1].strip().splitlines()[0][:120]
            print(f"{name}: {streams[-1]} streams do not fit: {why}", flush=True)
            rows.append(f"| {name} | decode, {streams[-1]} streams | does not fit: {why} | - | - | - | - |")
            streams = streams[:-1]
    return rows


def measure(name, model, processor, streams: list[int], args, bandwidth, peak) -> list[str]:
    most, page = max(streams), 128
    steps = getattr(args, "decode_steps", 1)
    max_length = args.prompt_len + (args.reps + 8) * steps + 64  # (timing, warm-up and trace calls)
    pages = -(-max_length // page)
    config = EngineConfig(max_slots=max(most, 2), max_length=max_length, decode_steps=steps, page_size=page,
                          num_pages=max(most, 2) * pages, prefill_tokens=args.prefill_tokens,
                          chunk_lengths=(args.prefill_tokens,), row_buckets=tuple(sorted({max(n, 2) for n in streams})),
                          enable_prefix_caching=False, attention_backend=getattr(args, "attention_backend", "auto"))
    engine = vsurge.oEngine(model, processor, config=config)
    start = time.perf_counter()
    engine.compile(progress=False)
    engine.deferred.wait()  # (an accelerator compiles some step programs after start-up)
    print(f"{name}: compiled in {time.perf_counter() - start:.0f} s; attention backend {engine.attention_backend}",
          flush=True)
    read, matmul_params = weight_bytes(engine.model)
    per_token = kv_bytes_per_token(engine.model)
    state_row = stored_row_bytes(engine.model, config.state_dtype)  # read and written once a step (hybrids)
    rows, rng = [], np.random.default_rng(0)
    layers, heads, hd = len(model.config.kv_layout), model.config.num_heads, model.config.head_dim
    for n in streams:
        scheduler, holder = engine.new_scheduler(), {"state": engine.init_state()}
        for _ in range(n):
            ids = rng.integers(10, min(model.config.vocab_size, 40000), args.prompt_len).tolist()
            budget = (args.reps + 8) * steps + 32
            request = ActiveRequest(ids, SamplingParams(max_tokens=budget, temperature=0.0, ignore_eos=True),
                                    0, budget, [], ReturnChannel(), detokenize=False)
            scheduler.add(Sequence.of(request, processor))

        def run(plan):
            holder["state"], out = engine.step(holder["state"], plan)
            jax.block_until_ready(out.tokens)
            return out

        plan, prefill = scheduler.schedule(), None
        while plan.chunks:
            tokens = sum(c.length for c in plan.chunks)
            if prefill is None and tokens == args.prefill_tokens and not plan.decode:
                prefill = (timed(lambda: run(plan), 2), tokens, plan)  # (re-running a prompt step rewrites its K/V)
            scheduler.postprocess(plan, run(plan).to_host(False))
            plan = scheduler.schedule()
        for _ in range(2):  # past the first decode steps, which the scheduler keeps to one step a call
            scheduler.postprocess(plan, run(plan).to_host(False))
            plan = scheduler.schedule()
        step = timed(lambda: run(plan), args.reps) / plan.num_steps  # a call runs num_steps decode steps
        if getattr(args, "trace", None) and n in (streams[0], streams[-1]):
            slug = re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-")  # the device tool brings back plain names only
            trace(f"{args.trace}/{slug}-{n}", lambda: run(plan))
        context = args.prompt_len + 1
        kv_read = n * -(-context // page) * page * per_token + 2 * n * state_row
        roofline = (read + kv_read) / bandwidth
        cells = [f"{name}", f"decode, {n} streams", f"{step * 1e3:.2f}", f"{roofline * 1e3:.3f}",
                 f"{100 * roofline / step:.0f}%", f"{n / step:.0f}"]
        rows.append("| " + " | ".join(cells) + " | - |")
        if prefill is not None and n == streams[-1]:
            wall, tokens, _ = prefill
            causal = 4 * tokens * (args.prompt_len / 2) * heads * hd * layers  # QK^T and PV over ~half the prompt
            flops = 2 * (matmul_params - model.config.vocab_size * model.config.hidden_size) * tokens + causal
            mfu = f"{100 * flops / wall / peak:.0f}%" if peak else "-"
            rows.append(f"| {name} | prefill, {tokens} tokens | {wall * 1e3:.1f} | - | - | {tokens / wall:.0f} | "
                        f"{flops / wall / 1e12:.3g} TFLOP/s, MFU {mfu} |")
        print(rows[-1], flush=True)
        holder["state"] = None  # the pool goes before the next count's is made (two would not fit a 3B on 16 GB)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="8b,default", help="any of 8b, 3b, 1b (random Llama shapes), default and "
                                                  "hybrid (a ~0.5B Qwen3.5 shape and the dense model of its size; "
                                                  "hybrid-alone: without the dense one)")
    p.add_argument("--quantization", default=None, help="int8: the random shapes' matrices and head as int8 with "
                                                       "per-channel scales (the 8B shape then fits a 16 GB chip)")
    p.add_argument("--attention-backend", default="auto", help="EngineConfig.attention_backend (kv/backends)")
    p.add_argument("--streams", default="1,16,64,256")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--prefill-tokens", type=int, default=512)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--decode-steps", type=int, default=1,
                   help="decode steps per device call (the engine's multi-step decode; step ms = call / steps)")
    p.add_argument("--decode-queries", type=int, default=None,
                   help="the tpu backend's queries a kernel block on decode steps (kv/backends/tpu.DECODE_QUERIES)")
    p.add_argument("--trace", default=None, help="a folder: perfetto traces of the decode calls at the first "
                                                 "and last stream counts")
    p.add_argument("--bandwidth-gbs", type=float, default=None)
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--smoke", action="store_true", help="CPU: a tiny 8B-shaped model, 1 and 4 streams, short prompts")
    args = p.parse_args(argv)
    if args.smoke:
        args.streams, args.prompt_len, args.prefill_tokens, args.reps = "1,4", 64, 64, 3
    streams = [int(s) for s in args.streams.split(",")]
    if args.decode_queries:
        from vsurge.kv.backends import tpu

        tpu.DECODE_QUERIES = args.decode_queries
    bandwidth, peak, kind = device_limits(args)
    print(f"device: {kind}; memory {bandwidth / 1e9:.0f} GB/s; peak "
          f"{peak / 1e12:.0f} TFLOP/s" if peak else f"device: {kind}; memory {bandwidth / 1e9:.0f} GB/s", flush=True)
    _, processor = vsurge.load("default", progress=False)
    rows = []
    for which in args.models.split(","):
        if which in ("hybrid", "hybrid-alone"):  # the hybrid, then (not alone) the dense model of its size
            from hybrid_decode import models as hybrid_models

            for name, model in list(hybrid_models(jnp.bfloat16).items())[:1 if which == "hybrid-alone" else 2]:
                rows += measure_what_fits(f"~0.5B {name}", model, processor, streams, args, bandwidth, peak)
                del model
            continue
        if which in SHAPES:
            model = random_llama(SMOKE_8B if args.smoke else SHAPES[which], args.quantization)
            name = model.config.name + (f", {args.quantization} weights" if args.quantization else "")
        else:
            model, _ = vsurge.load("default", dtype=jnp.bfloat16, progress=False)
            name = "default model (SmolLM2-135M)"
        rows += measure_what_fits(name, model, processor, streams, args, bandwidth, peak)
        del model
    print(f"\n`python benchmarks/roofline.py {' '.join(argv if argv is not None else sys.argv[1:])}`, {kind}, "
          f"{time.strftime('%Y-%m-%d')}; medians of {args.reps} steps\n")
    print("| model | step | ms | roofline ms | % roofline | tok/s | prefill |\n|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
