"""Prompt-lookup speculative decoding at one stream: its gain on a repetitive workload and on a random one.

One greedy request at a time through vSurge's paged engine (the `vsurge serve` defaults), with
`speculative_tokens` 0 (off) and K (on), on two workloads:

    quote     "Repeat this text exactly" + a ~150-word passage: the reply copies the prompt
    random    128 random words, ignore_eos: nothing to copy

Output tok/s is completion tokens over the request's time after its first token; the greedy
token ids must be identical with and without speculation (the script checks).

    python benchmarks/speculation.py [--tokens 128] [--drafts 6] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import vsurge  # noqa: E402
from vsurge import SamplingParams, vSurge  # noqa: E402

PASSAGE = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a small brass lamp "
           "and a notebook in which he wrote the weather, the ships he saw and the birds that rested on the "
           "railing. In winter the wind came from the north and the waves broke over the rocks below, throwing "
           "spray as high as the lantern room. In summer the sea was calm and green, and fishing boats passed "
           "close to the island on their way to the harbour. He had kept the light for thirty years, and in all "
           "that time it had never once gone dark.")


def prompts(processor, n_random_words: int) -> dict[str, tuple[str, bool]]:
    quote = processor.apply_chat_template(
        [{"role": "user", "content": f"Repeat this text exactly, word for word:\n\n{PASSAGE}"}],
        tokenize=False, add_generation_prompt=True)
    rng = random.Random(0)
    words = ["apple", "river", "stone", "cloud", "music", "table", "green", "seven", "north", "glass", "paper",
             "horse", "light", "window", "silver", "garden"]
    noise = " ".join(rng.choice(words) for _ in range(n_random_words))
    return {"quote": (quote, False), "random": (noise, True)}


async def timed(surge, prompt: str, params: SamplingParams) -> tuple[list[int], float]:
    start, first, ids = time.perf_counter(), None, []
    async for samples in surge.complete(vsurge.vSurgeRequest.from_sampling_params(prompt, params)):
        for s in samples:
            if s.token_ids:
                first = first or time.perf_counter()
                ids.extend(s.token_ids)
    rate = (len(ids) - 1) / max(time.perf_counter() - (first or start), 1e-9)
    return ids, rate


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--drafts", type=int, default=6)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    model, processor = vsurge.load("default")
    surge = vSurge.create_odriver(model, processor, max_length=1024, speculative_tokens=args.drafts)
    surge.compile()
    surge.start()
    rows = []
    try:
        for name, (prompt, ignore_eos) in prompts(processor, 128).items():
            rates: dict[int, list[float]] = {0: [], args.drafts: []}
            outputs = {}
            for _ in range(args.reps + 1):  # the first round warms up
                for k in rates:
                    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=ignore_eos,
                                            speculative_tokens=k)
                    ids, rate = asyncio.run(timed(surge, prompt, params))
                    outputs[k] = ids
                    rates[k].append(rate)
            same = outputs[0] == outputs[args.drafts]
            off, on = (statistics.median(r[1:]) for r in rates.values())
            rows.append((name, len(outputs[0]), off, on, same))
            print(f"{name}: off {off:.1f} tok/s, on {on:.1f} tok/s, identical output: {same}", file=sys.stderr)
    finally:
        surge.stop()
    print(f"\nOne greedy stream, paged engine (vsurge serve defaults), {args.tokens} tokens at most, "
          f"speculative_tokens {args.drafts}, medians of {args.reps}\n")
    print("| workload | tokens | off tok/s | on tok/s | gain | identical output |\n|---|---|---|---|---|---|")
    for name, n, off, on, same in rows:
        print(f"| {name} | {n} | {off:.1f} | {on:.1f} | {on / off:.2f}x | {'yes' if same else 'NO'} |")
    return 0 if all(r[-1] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
