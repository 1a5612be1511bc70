"""Multi-LoRA serving benchmark: 32 concurrent streams spread over 8 adapters (rank 16, every attention
and MLP projection) against the same load on the base model, the default model, one run.

Three measurements, each server alone on the machine:

    base, no LoRA      `vsurge serve` (no flags): the requests name the base model
    base, LoRA on      `vsurge serve --lora a0=... --lora a7=...` (--max-loras 8): the base model's requests
                       (what serving adapters costs the base's own users)
    8 adapters         the same server: request i names adapter a{i % 8}

plus the time `POST /v1/load_lora_adapter` takes for a ninth adapter (rank 16) on the running server.
The adapters are random (PEFT's file layout, written here with safetensors), B ~ N(0, 0.02^2).

    python benchmarks/lora.py [--prompts 64] [--concurrency 32] [--write-readme]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import Server, isa_line, vsurge_cmd, write_readme  # noqa: E402

from vsurge.cli.bench_serve import format_summary, run  # noqa: E402

RANK, ADAPTERS = 16, 8
MODULES = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def write_adapter(folder: Path, shapes: dict, seed: int) -> None:
    """A random PEFT LoRA adapter: shapes maps each projection to (in, out)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for module, (fan_in, fan_out) in shapes.items():
        prefix = f"base_model.model.{module}"
        tensors[f"{prefix}.lora_A.weight"] = (rng.normal(size=(RANK, fan_in)) / np.sqrt(fan_in)).astype(np.float32)
        tensors[f"{prefix}.lora_B.weight"] = rng.normal(0, 0.02, size=(fan_out, RANK)).astype(np.float32)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    targets = sorted({m for names in MODULES.values() for m in names})
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": RANK, "lora_alpha": RANK, "target_modules": targets, "bias": "none"}))


def default_model_shapes() -> dict:
    from vsurge.loading import load

    model, _ = load("default", progress=False, load_processor=False)
    c = model.config
    sizes = {"q_proj": (c.hidden_size, c.q_size), "k_proj": (c.hidden_size, c.kv_size),
             "v_proj": (c.hidden_size, c.kv_size), "o_proj": (c.q_size, c.hidden_size),
             "gate_proj": (c.hidden_size, c.intermediate_size), "up_proj": (c.hidden_size, c.intermediate_size),
             "down_proj": (c.intermediate_size, c.hidden_size)}
    return {f"model.layers.{i}.{group}.{name}": sizes[name]
            for i in range(c.num_layers) for group, names in MODULES.items() for name in names}


def load(server: Server, models, args) -> dict:
    summary = asyncio.run(run(server.base, models, args.prompts, args.input_len, args.output_len, float("inf"),
                              args.concurrency, None, 2))
    if summary["failed"]:
        raise SystemExit(f"{summary['failed']} requests failed: {summary['errors']}")
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--write-readme", action="store_true")
    args = p.parse_args()
    print(isa_line(), flush=True)
    folder = Path(tempfile.mkdtemp(prefix="vsurge-lora-bench-"))
    shapes = default_model_shapes()
    for k in range(ADAPTERS + 1):
        write_adapter(folder / f"a{k}", shapes, seed=k)
    rows = {}
    plain = Server("vsurge", vsurge_cmd(""), "/readiness")
    try:
        plain.wait_ready()
        base_name = plain.model()
        rows["base model, no LoRA"] = load(plain, base_name, args)
    finally:
        plain.stop()
    flags = " ".join(f"--lora a{k}={folder / f'a{k}'}" for k in range(ADAPTERS)) + f" --max-loras {ADAPTERS}"
    lora = Server("vsurge+lora", vsurge_cmd(flags), "/readiness")
    try:
        lora.wait_ready()
        rows["base model, LoRA on"] = load(lora, base_name, args)
        rows[f"{ADAPTERS} adapters (rank {RANK})"] = load(lora, [f"a{k}" for k in range(ADAPTERS)], args)
        start = time.perf_counter()
        r = httpx.post(lora.base + "/v1/load_lora_adapter", timeout=120,
                       json={"lora_name": f"a{ADAPTERS}", "lora_path": str(folder / f"a{ADAPTERS}")})
        load_s = time.perf_counter() - start
        assert r.status_code == 200, r.text
        one = asyncio.run(run(lora.base, f"a{ADAPTERS}", 1, args.input_len, 16, float("inf"), 1, None, 2))
    finally:
        lora.stop()
    for name, summary in rows.items():
        print(format_summary(name, summary), flush=True)
    ref = rows["base model, no LoRA"]
    lines = [f"`python benchmarks/lora.py`, default model, {args.prompts} requests {args.concurrency} at a time, "
             f"{args.input_len}-word prompts, {args.output_len} output tokens, streamed; {time.strftime('%Y-%m-%d')}, "
             f"this {os.cpu_count()}-core machine ({isa_line()}), one run.", "",
             "| load | tok/s | vs base, no LoRA | TTFT p50 s | vs base |", "|---|---|---|---|---|"]
    for name, s in rows.items():
        lines.append(f"| {name} | {s['output_throughput']:.1f} | {s['output_throughput'] / ref['output_throughput']:.2f}x "
                     f"| {s['ttft']['median']:.2f} | {s['ttft']['median'] / ref['ttft']['median']:.2f}x |")
    lines += ["", f"Loading a ninth rank-{RANK} adapter at run time (`POST /v1/load_lora_adapter`, read and checked): "
              f"{load_s:.2f} s; its first request (16 tokens, onto the device in that step): TTFT "
              f"{one['ttft']['median']:.2f} s."]
    text = "\n".join(lines)
    print(text)
    if args.write_readme:
        write_readme(text, "lora-table")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
