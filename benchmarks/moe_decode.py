"""A mixture-of-experts decode step against a dense model with the same active parameters.

Random bfloat16 weights (the serving default on CPU) at a Qwen3-30B-A3B-like shape scaled down
(hidden 1024, 8 layers, 16 query / 4 KV heads of 64, 64 experts of 384 units, top 8, vocabulary
32000) against the same model with one dense MLP of 8 x 384 = 3072 units in place of the experts:
every token multiplies the same number of weights in both. Each model runs on the paged engine;
after prefilling `rows` random prompts, decode steps (one per call, the engine's own program) are
timed; medians of alternating rounds (the machine may be shared).

    python benchmarks/moe_decode.py [--rows 1,8,32] [--reps 10]

At R rows a decode step must read every expert some row chose: about E * (1 - (1 - k/E)^R) of
them (random routing), against k experts' worth for the dense model. The "bytes bound" column is
that ratio for the whole model's weights: a step cannot beat it where weights stream from memory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import vsurge  # noqa: E402
from vsurge.config import Rope  # noqa: E402
from vsurge.engine.engine_config import EngineConfig  # noqa: E402
from vsurge.engine.request import ActiveRequest, ReturnChannel  # noqa: E402
from vsurge.engine.sequence import Sequence  # noqa: E402
from vsurge.models.families.qwen2_moe import Qwen2MoeConfig  # noqa: E402
from vsurge.models.families.qwen3 import Qwen3  # noqa: E402
from vsurge.models.families.qwen3_moe import Qwen3Moe  # noqa: E402
from vsurge.config import ModelConfig  # noqa: E402
from vsurge.sampling.params import SamplingParams  # noqa: E402

SHAPE = dict(vocab_size=32000, hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4, head_dim=64,
             qk_norm=True, rope=Rope(theta=1e6), max_position_embeddings=4096, eos_token_ids=(0,))
EXPERTS, TOP_K, EXPERT_UNITS = 64, 8, 384


def models():
    moe_config = Qwen2MoeConfig(architecture="qwen3_moe", intermediate_size=EXPERT_UNITS, num_experts=EXPERTS,
                                num_experts_per_tok=TOP_K, moe_intermediate_size=EXPERT_UNITS, norm_topk_prob=True,
                                **SHAPE)
    dense_config = ModelConfig(architecture="qwen3", intermediate_size=TOP_K * EXPERT_UNITS, **SHAPE)
    make = lambda family, config: family(config, dtype=jnp.float32, param_dtype=jnp.bfloat16,  # noqa: E731
                                         rngs=nnx.Rngs(0)).prepare_mixed_dtypes()
    return {"MoE (64 experts, top 8)": make(Qwen3Moe, moe_config), "dense (same active params)": make(Qwen3, dense_config)}


def decoding_engine(model, processor, rows: int, **changes):
    """A paged engine with `rows` sequences prefilled: (run one decode step, its plan). changes: more
    EngineConfig settings."""
    config = EngineConfig(max_slots=rows, max_length=512, decode_steps=1, prefill_tokens=512, page_size=128,
                          num_pages=rows * 4, **changes)
    engine = vsurge.oEngine(model, processor, config=config)
    scheduler, holder = engine.new_scheduler(), {"state": engine.init_state()}
    rng = np.random.default_rng(0)
    for _ in range(rows):
        ids = rng.integers(100, 30000, 64).tolist()
        request = ActiveRequest(ids, SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True), 0, 400, [],
                                ReturnChannel())
        scheduler.add(Sequence.of(request, processor, model.config.vocab_size))
    engine.compile(progress=False)
    engine.deferred.wait()  # (an accelerator compiles some step programs after start-up)

    def run(plan):
        holder["state"], out = engine.step(holder["state"], plan)
        jax.block_until_ready(out.tokens)
        return out

    plan = scheduler.schedule()
    while plan.chunks:
        scheduler.postprocess(plan, run(plan).to_host(False))
        plan = scheduler.schedule()
    assert len(plan.decode) == rows
    return (lambda: run(plan)), engine


def median_step_ms(built: dict, processor, rows: int, reps: int, changes: dict | None = None) -> list[float]:
    """Each model's median ms per decode step at `rows` rows, timed in alternating rounds (load from
    elsewhere slows every model alike). changes: name -> more EngineConfig settings for that one."""
    changes = changes or {}
    steps = {name: decoding_engine(model, processor, rows, **changes.get(name, {}))[0]
             for name, model in built.items()}
    times = {name: [] for name in steps}
    for step in steps.values():
        step()
    for _ in range(reps):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append((time.perf_counter() - start) * 1000)
    return [statistics.median(t) for t in times.values()]


def active_params(model) -> int:
    c = model.config
    total = 0
    for name, spec in model.weight_specs(c).items():
        n = int(np.prod(spec.shape))
        if name.endswith(("experts_gate_up", "experts_down")):
            n = n * TOP_K // EXPERTS  # a token multiplies k of the E experts
        total += n
    return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,8,32")
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    from vsurge.kernels import cpu_isa
    from vsurge.loading import load_processor

    processor = load_processor("default")
    built = models()
    moe_model, dense_model = built.values()
    print(f"CPU ISA: {cpu_isa()}; bfloat16 weights, paged engine; ms per decode step, median of {args.reps} "
          f"alternating rounds\n")
    print(f"MoE: {active_params(moe_model) / 1e6:.0f}M active of {moe_model.num_params / 1e6:.0f}M params; dense: "
          f"{dense_model.num_params / 1e6:.0f}M\n")
    print("| rows | MoE ms | dense ms | MoE / dense | bytes bound |")
    print("|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        moe, dense = median_step_ms(built, processor, rows, args.reps)
        print(f"| {rows} | {moe:.1f} | {dense:.1f} | {moe / dense:.2f}x | {bytes_bound(moe_model, dense_model, rows):.2f}x |",
              flush=True)
    return 0


def bytes_bound(moe_model, dense_model, rows: int) -> float:
    """Weight bytes one MoE step reads over the dense model's (experts any of `rows` random rows chose)."""
    chosen = EXPERTS * (1 - (1 - TOP_K / EXPERTS) ** rows)
    moe = active_params(moe_model) + (moe_model.num_params - active_params(moe_model)) * (chosen - TOP_K) / (
        EXPERTS - TOP_K)
    return moe / dense_model.num_params


if __name__ == "__main__":
    sys.exit(main())
