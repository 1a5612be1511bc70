"""A ~1B Llama-shaped Q4_K_M GGUF: peak memory and speed of `vsurge serve` vs `llama-server` (issue 20).

Makes the file once (cached under ~/.cache/vsurge-bench): random bfloat16 weights at a ~1.1B
Llama shape (TinyLlama's: hidden 2048, 22 layers, 32 heads, 4 KV heads, MLP 5632) with the default
model's tokenizer, written by transformers' safetensors layout, converted by llama.cpp's own
convert_hf_to_gguf.py to f16 and quantized by llama-quantize to Q4_K_M (Q4_K + Q6_K blocks).

Then each server runs alone with the same 32 x 2048 tokens of context:
    vsurge serve --model FILE --max-length 2048               (32 slots on this CPU; blocks kept)
    llama-server -m FILE -np 32 -c 65536 -t <cores>
and is measured at one stream (4 requests in turn) and 8 concurrent (8 requests), 128-word prompts,
128 greedy tokens, and on new 2000- and 512-token prompts (time to first token); llama-bench's pp512
runs on the same file too. Peak resident memory is the server process's VmHWM (/proc/PID/status) after
the loads: weights, KV pool, compiled programs and all.

`--size 3b`: Llama 3.2 3B's shape instead (hidden 3072, 28 layers, 24 heads, 8 KV heads, MLP 8192;
~3.1B with this vocabulary), with 8 slots each (`--max-concurrent-decodes 8`, `-np 8 -c 16384`).

    python benchmarks/gguf_memory.py [--size 1b|3b] [--type Q4_K_M] [--vsurge-args "--kv-cache-dtype int8"]
                                     [--write-readme]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve import Server, isa_line, llama_server_binary, vsurge_cmd, write_readme  # noqa: E402

from vsurge.cli.bench_serve import TABLE_HEADER, format_summary, run  # noqa: E402

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vsurge-bench"
COMMON = {"max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
# --size: TinyLlama's ~1.1B shape (the default), and Llama 3.2 3B's (~3.1B with this vocabulary)
SHAPES = {"1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
                 "num_key_value_heads": 4, **COMMON},
          "3b": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
                 "num_key_value_heads": 8, **COMMON}}
SLOTS_OF = {"1b": 32, "3b": 8}  # the ~3B shape's KV at 32 x 2048 tokens would be 7.5 GiB a server
LOADS = [("1 stream", 4, 1), ("8 concurrent", 8, 8)]  # (name, prompts, concurrency)
PROMPT_TOKENS, PROMPT_RUNS = 2000, 3  # prompt processing: a 2000-token prompt (one token per word), 1 output token
SHORT_PROMPT = 512  # and a 512-token one, beside llama-bench's pp512 on the same file
CONTEXT = 2048


def write_checkpoint(out: Path, shape: dict) -> None:
    """Random bfloat16 weights at `shape`, in transformers' own layout, with the default model's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from vsurge.loading import load_processor

    tokenizer = load_processor("default")
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, torch_dtype="bfloat16", **shape)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)  # bfloat16 before any memory: 6 GiB at ~3B, not 19
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def make_gguf(binary: str, kind: str = "Q4_K_M", size: str = "1b") -> Path:
    """The cached file of llama-quantize type `kind` at shape `size`, made on first use (~5 minutes on 2
    cores at ~1B; the f16 conversion is kept for the next type)."""
    target = CACHE / f"llama-{size}-random-{kind}.gguf"
    if target.exists():
        return target
    llama_cpp = Path(binary).parents[2]
    hf, f16 = CACHE / f"llama-{size}-random-hf", CACHE / f"llama-{size}-random-f16.gguf"
    CACHE.mkdir(parents=True, exist_ok=True)
    if not (hf / "config.json").exists():
        print("writing the random checkpoint ...", flush=True)
        write_checkpoint(hf, SHAPES[size])
    if not f16.exists():
        import importlib.util

        if importlib.util.find_spec("sentencepiece") is None:  # its vocabulary path imports it (the error is hidden)
            sys.exit("llama.cpp's convert_hf_to_gguf.py needs the sentencepiece package: pip install sentencepiece")
        print("converting with convert_hf_to_gguf.py ...", flush=True)
        env = {**os.environ, "PYTHONPATH": str(llama_cpp / "gguf-py")}
        subprocess.run([sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(hf), "--outfile", str(f16),
                        "--outtype", "f16"], env=env, check=True, capture_output=True)
    print(f"quantizing to {kind} with llama-quantize ...", flush=True)
    partial = target.with_suffix(".partial")
    subprocess.run([str(Path(binary).parent / "llama-quantize"), str(f16), str(partial), kind], check=True,
                   capture_output=True)
    partial.rename(target)
    return target


def peak_rss_gib(pid: int) -> float:
    """The process's high-water resident set (VmHWM), GiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError(f"no VmHWM for pid {pid}")


def measure(server: Server, input_len: int, output_len: int) -> dict:
    model = server.model()
    results = {}
    for index, (name, prompts, concurrency) in enumerate(LOADS):
        # each load its own prompts: a load that began with the last one's would find them in both servers'
        # prompt caches (until 2026-12-06 the 8-concurrent load's first 4 were the 1-stream load's)
        summary = asyncio.run(run(server.base, model, prompts, input_len, output_len, float("inf"), concurrency,
                                  None, 2, seed=101 + index))
        print(format_summary(f"{server.name} · {name}", summary), flush=True)
        if summary["failed"]:
            print(f"  {summary['failed']} failed: {summary['errors']}", file=sys.stderr, flush=True)
        results[name] = summary["output_throughput"]
        results[f"{name} TTFT"] = summary["ttft"]["median"]
    # prompt processing: each prompt new (no cached prefix), its time to first token is its prefill
    for key, tokens, seed in (("prompt", PROMPT_TOKENS, 7), ("prompt 512", SHORT_PROMPT, 11)):
        summary = asyncio.run(run(server.base, model, PROMPT_RUNS, tokens, 1, float("inf"), 1, None, 2, seed=seed))
        print(format_summary(f"{server.name} · {tokens}-token prompt", summary), flush=True)
        results[key] = tokens / summary["ttft"]["median"]
    results["peak RSS GiB"] = peak_rss_gib(server.proc.pid)
    return results


def llama_bench_pp512(binary: str, file: Path) -> float | None:
    """llama-bench's pp512 (prompt tokens/s, its median of 5) on the file, or None without llama-bench."""
    bench = Path(binary).with_name("llama-bench")
    if not bench.exists():
        return None
    out = subprocess.run([str(bench), "-m", str(file), "-p", str(SHORT_PROMPT), "-n", "0", "-t",
                          str(os.cpu_count() or 2), "-o", "json"], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def start_line(log: str) -> str:
    """vsurge's start-up lines on its weights (by format) and KV pool, for the table's note."""
    lines = [line.strip() for line in Path(log).read_text().splitlines()
             if line.startswith(("Weights:", "Paged KV cache:"))]
    return "; ".join(lines)


def table(vs: dict, peer: dict, file: Path, command: str, vsurge_args: str, note: str, kind: str, size: str) -> str:
    gib, slots = file.stat().st_size / 2**30, SLOTS_OF[size]
    shape = "a ~1.1B Llama shape" if size == "1b" else "Llama 3.2 3B's shape (~3.1B)"
    lines = [f"`{command}`: random weights at {shape}, {kind} by llama-quantize ({gib:.2f} GiB file), "
             f"{slots} slots x {CONTEXT} tokens of context each, 128-word prompts, 128 output tokens; "
             f"{time.strftime('%Y-%m-%d')}, this 2-core machine ({isa_line()}), one run.", "",
             "| measure | vsurge | llama-server | ratio |", "|---|---|---|---|"]
    for key, unit in [("peak RSS GiB", "peak RSS GiB"), ("1 stream", "1 stream tok/s"),
                      ("8 concurrent", "8 concurrent tok/s"), ("8 concurrent TTFT", "8 concurrent TTFT p50 s"),
                      ("prompt", f"prompt tok/s ({PROMPT_TOKENS}-token prompt, median of {PROMPT_RUNS})"),
                      ("prompt 512", f"prompt tok/s ({SHORT_PROMPT}-token prompt, median of {PROMPT_RUNS})")]:
        lines.append(f"| {unit} | {vs[key]:.2f} | {peer[key]:.2f} | {vs[key] / peer[key]:.2f}x |")
    lines += ["", f"vsurge ran `vsurge serve --model FILE --max-length {CONTEXT}"
              + (f" --max-concurrent-decodes {slots}" if slots != 32 else "")
              + (f" {vsurge_args}" if vsurge_args else "") + f"`; llama-server `-np {slots} -c {slots * CONTEXT}`."]
    if peer.get("pp512"):
        lines.append(f"llama-bench on the same file, `-p {SHORT_PROMPT} -n 0 -t <cores>`: pp{SHORT_PROMPT} "
                     f"{peer['pp512']:.1f} tok/s (vsurge's {SHORT_PROMPT}-token prompt through its server: "
                     f"{vs['prompt 512'] / peer['pp512']:.2f}x that).")
    if note:
        lines.append(f"vsurge's start-up line: `{note}`")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vsurge-args", default="", help="extra `vsurge serve` flags")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--write-readme", action="store_true")
    p.add_argument("--readme-marker", default="gguf-memory-table")
    p.add_argument("--skip-llama", action="store_true", help="vsurge alone (no table)")
    p.add_argument("--type", default="Q4_K_M", help="llama-quantize's type for the file (Q4_0, Q5_K_M, Q6_K, Q8_0, ...)")
    p.add_argument("--size", default="1b", choices=sorted(SHAPES), help="the model's shape: ~1.1B or ~3B")
    args = p.parse_args(argv)
    print(isa_line())
    binary = llama_server_binary()
    file = make_gguf(binary, args.type, args.size)
    slots = SLOTS_OF[args.size]
    print(f"{file} ({file.stat().st_size / 2**30:.2f} GiB)\n{TABLE_HEADER}", flush=True)
    more = f"--max-concurrent-decodes {slots} " if slots != 32 else ""
    vsurge = Server("vsurge", vsurge_cmd(f"--model {shlex.quote(str(file))} --max-length {CONTEXT} {more}"
                                         f"{args.vsurge_args}"), "/readiness")
    print(f"vsurge ready in {vsurge.wait_ready(3600):.1f} s", flush=True)
    try:
        vs = measure(vsurge, args.input_len, args.output_len)
    finally:
        vsurge.stop()
    if args.skip_llama:
        print(json.dumps({"vsurge": vs}))
        return 0
    llama = Server("llama-server", [binary, "-m", str(file), "--host", "127.0.0.1", "--port", "{port}",
                                    "-np", str(slots), "-c", str(slots * CONTEXT), "-t", str(os.cpu_count() or 2)],
                   "/health")
    llama.wait_ready()
    try:
        peer = measure(llama, args.input_len, args.output_len)
    finally:
        llama.stop()
    peer["pp512"] = llama_bench_pp512(binary, file)
    print(json.dumps({"vsurge": vs, "llama-server": peer}))
    command = "python benchmarks/gguf_memory.py" + (f" --type {args.type}" if args.type != "Q4_K_M" else "") + (
        f" --size {args.size}" if args.size != "1b" else "") + (
        f" --vsurge-args {shlex.quote(args.vsurge_args)}" if args.vsurge_args else "")
    text = table(vs, peer, file, command, args.vsurge_args, start_line(vsurge.log.name), args.type, args.size)
    print("\n" + text)
    if args.write_readme:
        write_readme(text, args.readme_marker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
