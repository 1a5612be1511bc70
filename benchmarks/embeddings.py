"""Batched embeddings: 64 short inputs in ONE /v1/embeddings call against the same 64 inputs sent as 64
calls one after another, on `vsurge serve` (no flags: the default model, bfloat16 weights).

The engine packs a call's inputs several per row into as few device calls as its token budget
allows (engine/encode.py); 64 calls in turn each pay a device call, the HTTP round trip and the
driver hop. Both sides are timed on the client (the openai SDK, float encoding), medians of
interleaved rounds after a warm-up of every shape. The issue's target: the one call serves the
inputs at >= 5x the rate of the calls in turn.

    python benchmarks/embeddings.py [--rounds 3] [--inputs 64] [--vsurge-args "..."]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import openai

from serve import Server, vsurge_cmd

SUBJECTS = ["The river", "A small robot", "My grandmother", "The old train", "Every comet", "This recipe",
            "The chess club", "A quiet owl"]
VERBS = ["crossed", "painted", "remembered", "followed", "explained", "carried", "repaired", "described"]
OBJECTS = ["the northern bridge.", "a map of the stars.", "the winter garden.", "its first song.",
           "the broken clock.", "a bowl of rice.", "the desert road.", "the harbour lights."]


def sentences(n: int) -> list[str]:
    """n different short sentences (about 8 tokens each)."""
    return [f"{SUBJECTS[i % 8]} {VERBS[(i // 8) % 8]} {OBJECTS[(i * 3 + i // 8) % 8]}" for i in range(n)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--inputs", type=int, default=64)
    p.add_argument("--vsurge-args", default="")
    args = p.parse_args(argv)
    server = Server("vsurge", vsurge_cmd(args.vsurge_args), "/readiness")
    ready = server.wait_ready()
    print(f"vsurge ready in {ready:.1f} s", file=sys.stderr, flush=True)
    texts = sentences(args.inputs)
    try:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)
        model = server.model()
        tokens = client.embeddings.create(model=model, input=texts, encoding_format="float").usage.prompt_tokens
        for text in texts:  # every single-input shape compiled and run once
            client.embeddings.create(model=model, input=text, encoding_format="float")
        batched, in_turn = [], []
        for _ in range(args.rounds):  # interleaved, so machine noise hits both alike
            start = time.perf_counter()
            out = client.embeddings.create(model=model, input=texts, encoding_format="float")
            batched.append(time.perf_counter() - start)
            assert len(out.data) == len(texts)
            start = time.perf_counter()
            for text in texts:
                client.embeddings.create(model=model, input=text, encoding_format="float")
            in_turn.append(time.perf_counter() - start)
            print(f"one call {batched[-1]:.3f} s, {len(texts)} calls {in_turn[-1]:.3f} s", file=sys.stderr, flush=True)
    finally:
        server.stop()
    one, many = statistics.median(batched), statistics.median(in_turn)
    n = len(texts)
    from vsurge.kernels import cpu_isa

    print(f"\n{n} short inputs ({tokens} tokens), `vsurge serve` {args.vsurge_args or '(no flags)'}, "
          f"CPU ISA {cpu_isa()}, median of {args.rounds} interleaved rounds\n")
    print("| how | wall s | inputs/s |\n|---|---|---|")
    print(f"| {n} inputs in one call | {one:.3f} | {n / one:.1f} |")
    print(f"| {n} calls in turn | {many:.3f} | {n / many:.1f} |")
    print(f"\none call / calls in turn: {many / one:.1f}x the rate (target >= 5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
