"""vSurge continuous batching on the default model: offline throughput, TTFT and TPOT by concurrency.

Every request streams 128 tokens (ignore_eos) from a different prompt; all
requests of a level are submitted at once. llama-cpp-python's single-stream
speed is measured in the same run as the reference.

    python benchmarks/vsurge_bench.py [--levels 1,8,32] [--tokens 128] [--quantization none,int8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from common import chat, llama_cpp_model, median_time


async def one_request(surge, prompt, tokens):
    from vsurge import vSurgeRequest

    start = time.perf_counter()
    first = None
    count = 0
    request = vSurgeRequest(prompt=prompt, max_tokens=tokens, temperature=0.0, ignore_eos=True)
    async for samples in surge.complete(request):
        count += len(samples[0].token_ids)
        first = first or time.perf_counter()
    end = time.perf_counter()
    return first - start, (end - first) / max(count - 1, 1), count


async def level(surge, prompts, tokens):
    start = time.perf_counter()
    results = await asyncio.gather(*(one_request(surge, p, tokens) for p in prompts))
    wall = time.perf_counter() - start
    ttft = [r[0] for r in results]
    tpot = [r[1] for r in results]
    return sum(r[2] for r in results) / wall, statistics.median(ttft), max(ttft), statistics.median(tpot)


def bench_vsurge(quantization, levels, tokens):
    import vsurge
    from vsurge import vSurge

    model, processor = vsurge.load("default", quantization=quantization, progress=False)
    slots = max(levels)
    surge = vSurge.create_vdriver(model, processor, max_concurrent_decodes=slots, prefill_lengths=[64],
                                  max_prefill_length=64, max_length=64 + tokens)
    surge.compile()
    surge.start()
    rows = []
    try:
        prompts = [processor.apply_chat_template(chat(i), tokenize=False) for i in range(max(levels))]
        asyncio.run(level(surge, prompts[:2], 4))  # warm-up
        for n in levels:
            rows.append((n, *asyncio.run(level(surge, prompts[:n], tokens))))
    finally:
        surge.stop()
    return rows


def bench_llama_cpp(tokens):
    llm = llama_cpp_model()
    if llm is None:
        return None
    eos = llm.token_eos()

    def gen():
        llm.create_chat_completion(chat(0), max_tokens=tokens, temperature=0.0, logit_bias={eos: -1e9})

    gen()
    return tokens / median_time(gen, 3)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--quantization", default="none,int8")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    cpp = bench_llama_cpp(args.tokens)
    print(f"\nvSurge (vDriver), default model, {args.tokens} streamed tokens per request, all requests at once\n")
    print("| weights | concurrent | output tok/s | TTFT p50 s | TTFT max s | TPOT p50 ms | vs llama.cpp 1 stream |")
    print("|---|---|---|---|---|---|---|")
    for q in args.quantization.split(","):
        for n, tps, ttft, ttft_max, tpot in bench_vsurge(None if q == "none" else q, levels, args.tokens):
            ratio = f"{tps / cpp:.2f}x" if cpp else "n/a"
            print(f"| {'float32' if q == 'none' else q} | {n} | {tps:.1f} | {ttft:.2f} | {ttft_max:.2f} | "
                  f"{tpot * 1000:.0f} | {ratio} |", flush=True)
    if cpp:
        print(f"\nllama-cpp-python (Q4_1, one stream, same run): {cpp:.1f} tok/s")
    else:
        print("\n(llama-cpp-python is not installed: pip install -e '.[bench]')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
