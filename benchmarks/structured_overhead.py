"""What JSON-schema constrained decoding costs a serving engine: `vsurge serve` (no flags), 16 chat
requests at once, every one constrained by a JSON schema, against the same 16 requests unconstrained.

Both loads ask for the same thing ("list N facts about <topic> as JSON"), 128 tokens at most,
temperature 0, streamed with usage; output tok/s is completion tokens over wall time of the load.
Constrained replies end when their JSON is complete, so they may be shorter: the table shows the
tokens too. The issue's target: constrained tok/s >= 0.85x unconstrained.

    python benchmarks/structured_overhead.py [--rounds 3] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import httpx

from serve import Server, vsurge_cmd

TOPICS = ["the sea", "Paris", "volcanoes", "bees", "the moon", "trains", "chess", "rice", "glaciers", "owls",
          "copper", "jazz", "deserts", "tea", "comets", "bridges"]
SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string"},
        "facts": {"type": "array", "items": {"type": "string"}, "minItems": 3},
        "confidence": {"type": "number"},
    },
    "required": ["topic", "facts", "confidence"],
    "additionalProperties": False,
}


async def one(client: httpx.AsyncClient, base: str, model: str, topic: str, constrained: bool, max_tokens: int):
    body = {"model": model, "temperature": 0, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"List five facts about {topic} as JSON with the fields "
                                                     "topic, facts (a list of strings) and confidence."}]}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "facts", "schema": SCHEMA}}
    tokens = 0
    async with client.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"usage"' in line and '"completion_tokens"' in line:
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    tokens = usage["completion_tokens"]
    return tokens


async def load(base: str, model: str, constrained: bool, concurrency: int, max_tokens: int) -> tuple[float, int]:
    async with httpx.AsyncClient() as client:
        start = time.perf_counter()
        counts = await asyncio.gather(*(one(client, base, model, TOPICS[i % len(TOPICS)], constrained, max_tokens)
                                        for i in range(concurrency)))
        elapsed = time.perf_counter() - start
    return sum(counts) / elapsed, sum(counts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--vsurge-args", default="")
    args = p.parse_args(argv)
    server = Server("vsurge", vsurge_cmd(args.vsurge_args), "/readiness")
    ready = server.wait_ready()
    print(f"vsurge ready in {ready:.1f} s", file=sys.stderr, flush=True)
    try:
        model = server.model()
        asyncio.run(load(server.base, model, True, 2, 16))  # the first request pays nothing extra later
        results: dict[bool, list[tuple[float, int]]] = {False: [], True: []}
        for _ in range(args.rounds):  # interleaved, so machine noise hits both alike
            for constrained in (False, True):
                results[constrained].append(asyncio.run(load(server.base, model, constrained, args.concurrency,
                                                             args.max_tokens)))
                print(f"{'json_schema' if constrained else 'free'}: {results[constrained][-1][0]:.1f} tok/s "
                      f"({results[constrained][-1][1]} tokens)", file=sys.stderr, flush=True)
    finally:
        server.stop()
    free = statistics.median(r[0] for r in results[False])
    fixed = statistics.median(r[0] for r in results[True])
    print(f"\n{args.concurrency} concurrent chat requests, max_tokens {args.max_tokens}, temperature 0, "
          f"median of {args.rounds} interleaved rounds, `vsurge serve` {args.vsurge_args or '(no flags)'}\n")
    print("| load | output tok/s | completion tokens (median) |\n|---|---|---|")
    print(f"| unconstrained | {free:.1f} | {statistics.median(r[1] for r in results[False]):.0f} |")
    print(f"| every request json_schema | {fixed:.1f} | {statistics.median(r[1] for r in results[True]):.0f} |")
    print(f"\nconstrained / unconstrained: {fixed / free:.2f}x (target >= 0.85x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
