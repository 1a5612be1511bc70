"""A hybrid model's decode step against a dense model of the same parameter count (issue 36's row).

Random bfloat16 weights (the serving default on CPU). The hybrid is Qwen3.5-shaped, scaled to
~0.5B: hidden 1024, 24 layers, three Gated DeltaNet layers (16 key / 16 value heads of 128) to one
gated full-attention layer (8 query / 2 KV heads of 256, a quarter rotary), MLP 3584, vocabulary
32000. The dense model is Qwen3-shaped with the same hidden size, layers and heads on every layer,
its MLP widened until both hold the same number of parameters. Each runs on the paged engine;
after prefilling `rows` random 64-token prompts, decode steps (one per call, the
engine's own program) are timed; medians of alternating rounds (the machine may be shared).

    python benchmarks/hybrid_decode.py [--rows 1,8,32] [--reps 10] [--batched-states]

The hybrid runs twice: with its states stored in bfloat16 (the default for bfloat16 weights,
`--state-dtype auto`) and in float32. A DeltaNet layer reads and writes a (16, 128, 128) state per
sequence each step (1 MiB in float32),
where an attention layer reads its K/V of the context so far: at short contexts the hybrid moves
more bytes per row, at long ones fewer.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from vsurge.config import ModelConfig, Rope  # noqa: E402
from vsurge.models.families.qwen3 import Qwen3  # noqa: E402
from vsurge.models.families.qwen3_next import Qwen3Next, Qwen3NextConfig  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from moe_decode import median_step_ms  # noqa: E402

LAYERS = 24
SHAPE = dict(vocab_size=32000, hidden_size=1024, num_layers=LAYERS, num_heads=8, num_kv_heads=2, head_dim=256,
             qk_norm=True, max_position_embeddings=4096, eos_token_ids=(0,))


def models(dtype=jnp.float32):
    """{name: model}: the hybrid and the dense model of its parameter count, bfloat16 weights computing in
    `dtype` (float32 here, as the CPU serves; benchmarks/roofline.py --models hybrid runs them in bfloat16)."""
    hybrid_config = Qwen3NextConfig(
        architecture="qwen3_5_text", intermediate_size=3584, rope=Rope(theta=1e7, dim=64),
        linear_layers=tuple((i + 1) % 4 != 0 for i in range(LAYERS)), linear_key_heads=16, linear_value_heads=16,
        linear_key_dim=128, linear_value_dim=128, grouped_projections=False, **SHAPE)
    make = lambda family, config: family(config, dtype=dtype, param_dtype=jnp.bfloat16,  # noqa: E731
                                         rngs=nnx.Rngs(0)).prepare_mixed_dtypes()
    hybrid = make(Qwen3Next, hybrid_config)
    dense_config = ModelConfig(architecture="qwen3", intermediate_size=3584, rope=Rope(theta=1e7), **SHAPE)
    dense_params = sum(int(np.prod(w.shape)) for w in Qwen3.weight_specs(dense_config).values())
    per_unit = 3 * SHAPE["hidden_size"] * LAYERS  # parameters one more MLP unit adds
    width = 3584 + (hybrid.num_params - dense_params) // per_unit
    dense = make(Qwen3, dense_config.replace(intermediate_size=int(width)))
    return {"hybrid (3 DeltaNet : 1 attention)": hybrid, "dense (same params)": dense}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,8,32")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--batched-states", action="store_true",
                   help="gather every decode row's state and scatter it back (kv/recurrent.py ROW_BY_ROW_BYTES) "
                        "instead of updating each in place")
    args = p.parse_args()
    if args.batched_states:
        from vsurge.kv import recurrent

        recurrent.ROW_BY_ROW_BYTES = 1 << 62
    from vsurge import kernels
    from vsurge.loading import load_processor

    processor = load_processor("default")
    built = models()
    hybrid, dense = built.values()
    # the C++ kernels (the CPU paged-attention decode among them) speed the dense model's 24 attention
    # layers more than the hybrid's 6: say whether they were built
    built_kernels = "built" if kernels.available() else f"absent ({kernels.unavailable_reason()})"
    print(f"CPU ISA: {kernels.cpu_isa()}; C++ kernels {built_kernels}; bfloat16 weights, paged engine, 64-token prompts; "
          f"ms per decode step, median of {args.reps} alternating rounds\n")
    print(f"hybrid: {hybrid.num_params / 1e6:.0f}M params; dense: {dense.num_params / 1e6:.0f}M "
          f"(MLP {dense.config.intermediate_size})\n")
    # the hybrid twice: states stored as the default keeps them for bfloat16 weights (bfloat16), and in
    # float32 (`--state-dtype float32`, llama.cpp's choice)
    runs = {"hybrid": hybrid, "hybrid, float32 states": hybrid, "dense": dense}
    changes = {"hybrid, float32 states": {"state_dtype": "float32"}}
    print("| rows | hybrid ms (bfloat16 states, default) | hybrid ms (float32 states) | dense ms | hybrid / dense "
          "| float32 states / dense |")
    print("|---|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        h, h32, d = median_step_ms(runs, processor, rows, args.reps, changes)
        print(f"| {rows} | {h:.1f} | {h32:.1f} | {d:.1f} | {h / d:.2f}x | {h32 / d:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
