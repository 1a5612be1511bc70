"""How far greedy output of bfloat16, int8 and GGUF-block weights follows float32 on the default model.

For a few chat prompts: float32 generates 64 greedy tokens; then, over that text, the share of
positions where bfloat16 / int8 logits pick the same next token (teacher-forced), and how many
tokens their own greedy generation keeps identical before the first difference. This is why int8
weights, faster at one or two rows on CPU (docs/performance.md), are not the default. "blocks"
is the default GGUF load on CPU: the file's Q4_1 / Q8_0 blocks kept, multiplied by the C++ kernel,
which rounds activations to 8 bits per 32 values as llama.cpp does.

    python benchmarks/int8_agreement.py [--only blocks]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the reference Generator (tests/dense_generator.py)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import vsurge  # noqa: E402
from dense_generator import greedy_generate  # noqa: E402

PROMPTS = ["Write a short story about a robot who learns to paint.", "Explain how photosynthesis works in simple terms.",
           "List five tips for staying productive when working from home."]
TOKENS = 64


def main() -> int:
    from vsurge import kernels

    reference, processor = vsurge.load("default", dtype="float32", progress=False)
    makers = {"bfloat16": lambda: vsurge.load("default", dtype="bfloat16", progress=False)[0],
              "int8": lambda: vsurge.load("default", dtype="bfloat16", quantization="int8", progress=False)[0],
              "blocks": lambda: vsurge.load("default", quantization="blocks", progress=False)[0]}
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else list(makers)
    others = {name: makers[name]() for name in only}
    print(f"CPU ISA {kernels.cpu_isa()}, block kernel {kernels.variant()}")
    print(f"| prompt | weights | next-token agreement with float32 | greedy tokens identical (of {TOKENS}) |")
    print("|---|---|---|---|")
    for text in PROMPTS:
        ids = processor.apply_chat_template([{"role": "user", "content": text}])
        answer = greedy_generate(reference, ids, TOKENS, stop_token_ids=processor.eos_token_ids)
        full = jnp.asarray([ids + list(answer)])
        ref = np.asarray(reference(full)[0][0])[len(ids) - 1:].argmax(-1)
        for name, model in others.items():
            agree = (np.asarray(model(full)[0][0])[len(ids) - 1:].argmax(-1) == ref).mean()
            own = greedy_generate(model, ids, TOKENS, stop_token_ids=processor.eos_token_ids)
            same = next((i for i, (a, b) in enumerate(zip(answer, own)) if a != b), min(len(answer), len(own)))
            print(f"| {text[:40]}... | {name} | {agree:.3f} | {same} / {len(answer)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
