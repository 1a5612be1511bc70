"""A hybrid model served by vsurge and by llama.cpp's llama-server, same GGUF file (issue 36's row;
not run in CI: needs llama.cpp, built by ../shared/peers/build-llama-server.sh on first use).

The model is a random-weight Qwen3-Next scaled to ~0.5B (hidden 1024, 24 layers: Gated DeltaNet on
three in four with 16 key / 16 value heads of 128, gated attention with 8 query / 2 KV heads of 256
on the rest; 16 experts of 128, 4 used, and a 512 shared expert), saved by transformers in bfloat16
and written as GGUF by llama.cpp's own converter (`--outtype`, default q8_0). Then
benchmarks/serve.py runs its loads on `vsurge serve --model <file>` (no other flag) and on
`llama-server -np 32`: 1 stream and 8 concurrent requests by default.

    python benchmarks/hybrid_vs_llamacpp.py [--outtype q8_0] [--loads "1 stream,8 concurrent"] [--write-readme]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHAPE = dict(vocab_size=49152, hidden_size=1024, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2,
             head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
             linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=16, num_experts_per_tok=4,
             moe_intermediate_size=128, shared_expert_intermediate_size=512, intermediate_size=3584,
             full_attention_interval=4, max_position_embeddings=32768, tie_word_embeddings=False)


def write_checkpoint(folder: Path) -> None:
    """The random bfloat16 checkpoint, with the default model's tokenizer (the converter reads it)."""
    import torch
    import transformers

    from vsurge.loading import load_processor

    torch.manual_seed(0)
    processor = load_processor("default")
    config = transformers.Qwen3NextConfig(**SHAPE, bos_token_id=processor.bos_token_id,
                                          eos_token_id=processor.eos_token_id)
    model = transformers.Qwen3NextForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():  # transformers' init leaves A_log at log(U(0, 16)) and dt_bias at 1: keep
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.02)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    print(f"checkpoint: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--outtype", default="q8_0", help="the converter's --outtype (f32, f16, bf16, q8_0)")
    p.add_argument("--loads", default="1 stream,8 concurrent")
    p.add_argument("--write-readme", action="store_true")
    args = p.parse_args()
    from families_vs_llamacpp import convert
    from serve import llama_server_binary
    from serve import main as serve

    work = Path(tempfile.mkdtemp(prefix="hybrid-vs-llamacpp-"))
    write_checkpoint(work / "hf")
    llama_cpp = Path(llama_server_binary()).parents[2]
    gguf = work / f"qwen3next-0.5b-{args.outtype}.gguf"
    error = convert(llama_cpp, work / "hf", gguf, args.outtype)
    if error:
        raise SystemExit(f"llama.cpp's converter failed: {error}")
    print(f"GGUF: {gguf} ({gguf.stat().st_size / 2**20:.0f} MiB)", flush=True)
    command = "python benchmarks/hybrid_vs_llamacpp.py" + (f" --outtype {args.outtype}" if args.outtype != "q8_0" else "")
    argv = ["--model", str(gguf), "--loads", args.loads, "--readme-marker", "hybrid-serve-table"]
    return serve(argv + (["--write-readme"] if args.write_readme else []), argv_command=command)


if __name__ == "__main__":
    sys.exit(main())
