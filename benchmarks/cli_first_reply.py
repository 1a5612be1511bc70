"""The first five minutes: `vsurge chat`'s first reply against llama.cpp's server, same GGUF, same messages.

vsurge: `vsurge chat --json` with two questions piped on stdin (one JSON object per reply: time to the
first token, steady-state decode tok/s). llama.cpp: `llama-server -m GGUF -c 4096 -t 2`, the same chat
messages through its OpenAI endpoint, streamed, timed on the client. Prints a markdown table and the
ratios the issue asks for (first reply's TTFT vs llama-server's; first reply's decode speed vs the later
one's). Run it on a quiet machine; numbers move with load.

    python benchmarks/cli_first_reply.py [--llama-server PATH] [--seed 0] [--skip llama.cpp]

llama-server: --llama-server, else $LLAMA_SERVER, else ~/.cache/vsurge-peers/llama.cpp/build/bin/llama-server
(built by a peers script: not part of vsurge). Without it only vsurge's rows are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from common import default_gguf
from serve import Server

SYSTEM = "You are terse."
QUESTIONS = ["What is the capital of France?", "Write a short poem about the sea."]
# vsurge's defaults (llama.cpp's classic sampling), sent to llama-server explicitly
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.1}


def run_vsurge(seed: int, max_tokens: int, extra: list[str]) -> tuple[list[dict], float]:
    """Two replies of `vsurge chat --json` -> (reply objects, seconds from launch to the first reply)."""
    cmd = [sys.executable, "-m", "vsurge.cli", "chat", "--system", SYSTEM, "--json", "--seed", str(seed),
           "--max-tokens", str(max_tokens), *extra]
    start = time.perf_counter()
    out = subprocess.run(cmd, input="\n".join(QUESTIONS) + "\n", capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"vsurge chat failed ({out.returncode}):\n{out.stderr[-3000:]}")
    replies = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    ready = next((line for line in out.stderr.splitlines() if line.startswith("Ready in")), "")
    print(f"vsurge: {ready}", file=sys.stderr)
    return replies, time.perf_counter() - start


def find_llama_server(given: str | None) -> Path | None:
    for candidate in (given, os.environ.get("LLAMA_SERVER"),
                      Path.home() / ".cache/vsurge-peers/llama.cpp/build/bin/llama-server"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def stream_chat(base: str, messages: list[dict], seed: int, max_tokens: int) -> dict:
    """One streamed chat completion -> text, chunks, TTFT and decode tok/s measured on the client."""
    body = {"messages": messages, "stream": True, "seed": seed, "max_tokens": max_tokens, **SAMPLING}
    text, times = "", []
    start = time.perf_counter()
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            delta = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
            if delta:
                text += delta
                times.append(time.perf_counter())
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None
    return {"text": text, "completion_tokens": len(times),
            "timings": {"first_token_s": times[0] - start if times else None, "decode_tokens_per_s": rate}}


def run_llama_server(binary: Path, seed: int, max_tokens: int) -> list[dict]:
    server = Server("llama-server", [str(binary), "-m", str(default_gguf()), "-c", "4096", "-t", "2",
                                     "--host", "127.0.0.1", "--port", "{port}"], "/health")
    try:
        server.wait_ready(timeout=300)
        messages = [{"role": "system", "content": SYSTEM}]
        replies = []
        for question in QUESTIONS:
            messages.append({"role": "user", "content": question})
            replies.append(stream_chat(server.base, messages, seed, max_tokens))
            messages.append({"role": "assistant", "content": replies[-1]["text"]})
        return replies
    finally:
        server.stop()


def fmt(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-server", default=None, help="path of llama.cpp's llama-server binary")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--skip", default="", help="comma-separated: llama.cpp")
    p.add_argument("--vsurge-args", default="", help="extra `vsurge chat` flags, e.g. '--quantization int8'")
    args = p.parse_args()

    vsurge, wall = run_vsurge(args.seed, args.max_tokens, args.vsurge_args.split())
    rows = [("vsurge chat", i + 1, r) for i, r in enumerate(vsurge)]
    llama = None
    binary = find_llama_server(args.llama_server)
    if "llama.cpp" not in args.skip and binary is not None:
        llama = run_llama_server(binary, args.seed, args.max_tokens)
        rows += [("llama-server", i + 1, r) for i, r in enumerate(llama)]
    elif "llama.cpp" not in args.skip:
        print("(llama-server not found: give --llama-server PATH)", file=sys.stderr)

    print(f"default model, system {SYSTEM!r}, questions {QUESTIONS}, seed {args.seed}, "
          f"vsurge sampling defaults on both; vsurge chat from launch to exit {wall:.1f}s\n")
    print("| engine | reply | completion tokens | first token s | decode tok/s |")
    print("|---|---|---|---|---|")
    for engine, index, reply in rows:
        t = reply["timings"]
        print(f"| {engine} | {index} | {reply['completion_tokens']} | {fmt(t['first_token_s'], 3)} | "
              f"{fmt(t['decode_tokens_per_s'], 1)} |")
    first, later = vsurge[0]["timings"], vsurge[-1]["timings"]
    print()
    if first["decode_tokens_per_s"] and later["decode_tokens_per_s"]:
        print(f"vsurge first reply decode / later reply decode: "
              f"{first['decode_tokens_per_s'] / later['decode_tokens_per_s']:.2f}x (target >= 0.9x)")
    if llama and llama[0]["timings"]["first_token_s"]:
        print(f"vsurge first reply TTFT / llama-server TTFT: "
              f"{first['first_token_s'] / llama[0]['timings']['first_token_s']:.1f}x (target <= 3x)")
        if llama[-1]["timings"]["decode_tokens_per_s"] and later["decode_tokens_per_s"]:
            print(f"vsurge decode / llama-server decode (later replies): "
                  f"{later['decode_tokens_per_s'] / llama[-1]['timings']['decode_tokens_per_s']:.2f}x")


if __name__ == "__main__":
    main()
