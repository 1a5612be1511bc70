"""vInference speed on the default model: single-stream decode, prefill, batch-8 throughput.

Peers in the same run: HF transformers (torch, float32) and llama-cpp-python
(when installed). vsurge runs with its default bfloat16 weights, float32 and
int8 weights. Prints a markdown table of medians and the ratio of vsurge to each
peer, then the issue's batching check: a fresh vInference's first
`process_prompts_concurrently` of 8 prompts against its first single prompt,
compilation included in both.

    python benchmarks/vinference.py [--tokens 128] [--reps 3] [--prefill 512]
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from common import (STORY, chat, default_gguf, llama_cpp_model, measure_read_bandwidth, median_time,
                    single_stream_decode, transformers_model)


def bench_vsurge(dtype, quantization, tokens: int, reps: int, prefill: int):
    import vsurge
    from vsurge import SamplingParams, vInference, vInferenceConfig, vInferencePreCompileConfig

    model, processor = vsurge.load("default", dtype=dtype, quantization=quantization, progress=False)
    vi = vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=tokens))
    vi.precompile(vInferencePreCompileConfig(batch_size=[1, 8], prefill_length=[64, prefill]))
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    one = SamplingParams(max_tokens=1, temperature=0.0)
    decode, _, _ = single_stream_decode(vi, tokens, reps)
    long_ids = (processor.encode("The history of the world in many words. " * 200))[:prefill]
    prefill_time = median_time(lambda: list(vi.generate([long_ids], sampling_params=one)), reps)
    prompts = [chat(i) for i in range(8)]
    batch = median_time(lambda: asyncio.run(vi.process_prompts_concurrently(prompts, 8, params)), reps)
    return {"decode": decode, "prefill": prefill / prefill_time,
            "batch8": 8 * tokens / batch, "bytes": model.decode_bytes}


def first_calls(tokens: int) -> tuple[float, float]:
    """Seconds of a fresh vInference's first single prompt and first 8 concurrent prompts."""
    import time

    import vsurge
    from vsurge import SamplingParams, vInference, vInferenceConfig

    model, processor = vsurge.load("default", progress=False)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    vi = vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=tokens))
    start = time.perf_counter()
    vi.process_prompt(chat(0), params)
    one = time.perf_counter() - start
    start = time.perf_counter()
    asyncio.run(vi.process_prompts_concurrently([chat(i) for i in range(8)], 8, params))
    return one, time.perf_counter() - start


def bench_transformers(tokens: int, reps: int, prefill: int):
    import torch

    model, tok = transformers_model()

    def gen(msgs_list, n):
        texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in msgs_list]
        enc = tok(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            model.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tok.eos_token_id)

    gen([STORY], 2)
    full = median_time(lambda: gen([STORY], tokens), reps)
    first = median_time(lambda: gen([STORY], 1), reps)
    ids = torch.tensor([tok.encode("The history of the world in many words. " * 200)[:prefill]])
    with torch.no_grad():
        prefill_time = median_time(lambda: model(ids), reps)
    batch = median_time(lambda: gen([chat(i) for i in range(8)], tokens), reps)
    return {"decode": decode, "prefill": prefill / prefill_time, "batch8": 8 * tokens / batch,
            "bytes": sum(p.numel() * p.element_size() for p in model.parameters())}


def bench_llama_cpp(tokens: int, reps: int, prefill: int):
    llm = llama_cpp_model()
    if llm is None:
        return None
    eos = llm.token_eos()

    def gen(n, msgs=STORY):
        llm.create_chat_completion(msgs, max_tokens=n, temperature=0.0, logit_bias={eos: -1e9})

    gen(2)
    full = median_time(lambda: gen(tokens), reps)
    first = median_time(lambda: gen(1), reps)
    ids = llm.tokenize(("The history of the world in many words. " * 200).encode())[:prefill]

    def run_prefill():
        llm.reset()
        llm.eval(ids)

    prefill_time = median_time(run_prefill, reps)
    # llama-cpp-python runs one sequence at a time: 8 prompts are 8 sequential generations
    batch = median_time(lambda: [gen(tokens, chat(i)) for i in range(8)], 1)
    return {"decode": decode, "prefill": prefill / prefill_time, "batch8": 8 * tokens / batch,
            "bytes": default_gguf().stat().st_size}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prefill", type=int, default=512)
    args = parser.parse_args(argv)
    bandwidth = measure_read_bandwidth()
    one, eight = first_calls(args.tokens)
    rows = [("vsurge vInference bf16 (default)", bench_vsurge(None, None, args.tokens, args.reps, args.prefill)),
            ("vsurge vInference f32", bench_vsurge("float32", None, args.tokens, args.reps, args.prefill)),
            ("vsurge vInference int8", bench_vsurge(None, "int8", args.tokens, args.reps, args.prefill)),
            ("transformers f32", bench_transformers(args.tokens, args.reps, args.prefill))]
    cpp = bench_llama_cpp(args.tokens, args.reps, args.prefill)
    if cpp:
        rows.append(("llama.cpp Q4_1", cpp))
    else:
        print("(llama-cpp-python is not installed: pip install -e '.[bench]')", file=sys.stderr)
    best = max(r["decode"] for name, r in rows if name.startswith("vsurge"))
    print(f"\nvInference, default model, {args.tokens} new tokens (greedy, no early stop), prefill {args.prefill} "
          f"tokens, medians of {args.reps}; machine read bandwidth {bandwidth:.1f} GB/s\n")
    print("| engine | decode tok/s (1 stream) | weight GB/s | prefill tok/s | batch-8 tok/s | batch-8 / 1 stream "
          "| best vsurge decode / engine |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['decode']:.1f} | {r['bytes'] * r['decode'] / 1e9:.1f} | {r['prefill']:.0f} | "
              f"{r['batch8']:.1f} | {r['batch8'] / r['decode']:.1f}x | {best / r['decode']:.2f}x |")
    print(f"\nFresh vInference, first calls (compilation included): one prompt {one:.1f} s, "
          f"process_prompts_concurrently of 8 prompts {eight:.1f} s ({eight / one:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
