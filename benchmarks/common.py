"""Shared pieces of the benchmarks: prompts, timing, the machine's bandwidth, peer engines."""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to cook."}]
TOPICS = ["volcanoes", "the moon", "bees", "chess", "rivers", "robots", "tea", "glaciers",
          "owls", "bridges", "jazz", "deserts", "comets", "forests", "trains", "coral"]


def chat(i: int):
    return [{"role": "user", "content": f"Tell me everything you know about {TOPICS[i % len(TOPICS)]}."}]


def median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_read_bandwidth(gigabytes: float = 0.5, reps: int = 5) -> float:
    """GB/s of a jitted full reduction over a large float32 array (what decode does to weights)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((int(gigabytes * 1e9 / 4),), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    return x.nbytes / median_time(lambda: total(x).block_until_ready(), reps) / 1e9


def single_stream_decode(vi, tokens: int, reps: int) -> tuple[float, float, float]:
    """One greedy prompt (STORY) through a vInference: (decode tok/s without the prefill, whole
    request s, first token s); decode = (tokens - 1) / (whole - first), medians of `reps`."""
    from vsurge import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    one = SamplingParams(max_tokens=1, temperature=0.0)
    vi.process_prompt(STORY, params)
    vi.process_prompt(STORY, one)
    full = median_time(lambda: vi.process_prompt(STORY, params), reps)
    first = median_time(lambda: vi.process_prompt(STORY, one), reps)
    return (tokens - 1) / (full - first), full, first


def default_gguf():
    from vsurge.loading import default_model_path

    return default_model_path()


def transformers_model():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_gguf()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    return model, tok


def llama_cpp_model(n_ctx: int = 2048):
    """llama-cpp-python on the same GGUF, or None when it is not installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    return Llama(model_path=str(default_gguf()), n_ctx=n_ctx, n_threads=os.cpu_count(), verbose=False)
