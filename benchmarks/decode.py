"""Greedy single-stream decode speed: vsurge vs transformers (and llama-cpp-python when installed).

All engines generate the same number of tokens (no early stop) from the same
chat prompt on the default model, in one run on this machine. Prints a
markdown table with the median tok/s of several repetitions, the ratio to
vsurge, and the achieved weight bandwidth (weight bytes x tok/s) beside the
machine's measured memory read bandwidth.

    python benchmarks/decode.py [--tokens 128] [--reps 3] [--skip transformers,llama.cpp]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = [{"role": "user", "content": "Write a long story about a dragon who learns to cook."}]


def measure_read_bandwidth(gigabytes: float = 0.5, reps: int = 5) -> float:
    """GB/s of a jitted full reduction over a large float32 array (what decode must do to weights)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((int(gigabytes * 1e9 / 4),), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        total(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return x.nbytes / statistics.median(times) / 1e9


def bench_vsurge(tokens: int, reps: int, dtype: str):
    import jax.numpy as jnp

    import vsurge
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from dense_generator import Generator  # the reference path, a model alone (tests/dense_generator.py)

    model, processor = vsurge.load("default", dtype=getattr(jnp, dtype), progress=False)
    prompt = processor.apply_chat_template(PROMPT)
    gen = Generator(model, max_length=512)
    gen.generate(prompt, tokens)  # compile both steps
    rates = []
    for _ in range(reps):
        start = time.perf_counter()
        out = gen.generate(prompt, tokens)
        rates.append(len(out) / (time.perf_counter() - start))
    return statistics.median(rates), model.decode_bytes, f"JAX {dtype}"


def bench_transformers(tokens: int, reps: int):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vsurge.loading import default_model_path

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=tok.eos_token_id)
    with torch.no_grad():
        model.generate(ids, **kwargs)
        rates = []
        for _ in range(reps):
            start = time.perf_counter()
            out = model.generate(ids, **kwargs)
            rates.append((out.shape[1] - ids.shape[1]) / (time.perf_counter() - start))
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return statistics.median(rates), weight_bytes, f"torch {torch.__version__} f32, {torch.get_num_threads()} threads"


def bench_llama_cpp(tokens: int, reps: int):
    from llama_cpp import Llama

    from vsurge.loading import default_model_path

    path = default_model_path()
    llm = Llama(model_path=str(path), n_ctx=1024, n_threads=os.cpu_count(), verbose=False)
    eos = llm.token_eos()
    kwargs = dict(max_tokens=tokens, temperature=0.0, logit_bias={eos: -1e9})
    llm.create_chat_completion(PROMPT, **kwargs)
    rates = []
    for _ in range(reps):
        start = time.perf_counter()
        out = llm.create_chat_completion(PROMPT, **kwargs)
        rates.append(out["usage"]["completion_tokens"] / (time.perf_counter() - start))
    return statistics.median(rates), path.stat().st_size, f"llama-cpp-python, Q4_1, {os.cpu_count()} threads"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--skip", default="", help="comma list: transformers,llama.cpp")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))

    bandwidth = measure_read_bandwidth()
    rows = [("vsurge", *bench_vsurge(args.tokens, args.reps, args.dtype))]
    if "transformers" not in skip:
        rows.append(("transformers", *bench_transformers(args.tokens, args.reps)))
    if "llama.cpp" not in skip:
        try:
            rows.append(("llama.cpp", *bench_llama_cpp(args.tokens, args.reps)))
        except ImportError:
            print("(llama-cpp-python is not installed: pip install -e '.[bench]')", file=sys.stderr)

    ours = rows[0][1]
    print(f"\nGreedy decode, default model (SmolLM2-135M-Instruct), {args.tokens} new tokens, "
          f"median of {args.reps}; machine read bandwidth {bandwidth:.1f} GB/s\n")
    print("| engine | setup | tok/s | vsurge / engine | weight bytes | achieved GB/s |")
    print("|---|---|---|---|---|---|")
    for name, rate, weight_bytes, setup in rows:
        print(f"| {name} | {setup} | {rate:.1f} | {ours / rate:.2f}x | {weight_bytes / 1e6:.0f} MB | "
              f"{weight_bytes * rate / 1e9:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
