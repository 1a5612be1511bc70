"""The real default model on an accelerator against independent references computed on a CPU.

The accelerator machine has no PyTorch, so the references travel as a small file made here first:

    python benchmarks/tpu_agreement.py reference FILE.npz      # on a CPU with transformers + torch (the test venv)
    python benchmarks/tpu_agreement.py check FILE.npz          # on the accelerator, with the real model file
    python benchmarks/tpu_agreement.py gaps FILE.npz           # on a CPU: how near a tie each reference token is

`reference` stores (1) transformers' float32 logits for the default model (its own GGUF loader, as
tests/loading/test_default_model.py compares) on the chat prompt "What is the capital of France?" plus a tail with
an emoji and Japanese, and (2) vsurge's float32 greedy tokens on a CPU for 8 chat prompts, 16 tokens each.
(The file keeps the last 16 positions' logits and every position's argmax.) `check` runs (1) in float32 at JAX's highest matmul precision (max |logit difference| <= 2e-3 and the same
argmax everywhere, as the CPU test) and (2) in bfloat16, the accelerator's default dtype: how many prompts
keep all 16 tokens equal (issue 59: >= 6 of 8), and where the others part. Exit 1 when either misses.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the reference Generator (tests/dense_generator.py)

import numpy as np  # noqa: E402

from common import chat  # noqa: E402

CHAT_PROMPT = [{"role": "user", "content": "What is the capital of France?"}]
TAIL = " The capital of France is Paris. 🗼 日本語"
LOGIT_TOL = 2e-3
KEPT_POSITIONS = 16  # full logits kept for the last 16 positions (the tail), argmax for all: the file travels
# beside half of the model file in one call of the device tool (64 MiB)
PROMPTS, TOKENS, MUST_EQUAL = 8, 16, 6


def logit_ids(processor) -> list[int]:
    return processor.apply_chat_template(CHAT_PROMPT) + processor.encode(TAIL)


def prompt_ids(processor) -> list[list[int]]:
    return [processor.apply_chat_template(chat(i)) for i in range(PROMPTS)]


def reference(path: str) -> None:
    import jax.numpy as jnp
    import torch
    from transformers import AutoModelForCausalLM

    import vsurge
    from dense_generator import greedy_generate
    from vsurge.loading import default_model_path

    gguf = default_model_path()
    model, processor = vsurge.load("default", dtype=jnp.float32, progress=False)
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    ids = logit_ids(processor)
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].numpy()
    tokens = [greedy_generate(model, p, max_new_tokens=TOKENS) for p in prompt_ids(processor)]
    np.savez_compressed(path, ids=np.asarray(ids), logits=logits[-KEPT_POSITIONS:], argmax=logits.argmax(-1),
                        tokens=np.asarray(tokens))
    print(f"wrote {path}: logits {logits[-KEPT_POSITIONS:].shape} (of {logits.shape}), {len(tokens)} x {TOKENS} "
          f"CPU float32 greedy tokens")


def gaps(path: str) -> None:
    """Per prompt, the float32 model's smallest top-two logit gap over the 16 reference tokens: how near a tie
    each greedy choice is (a bfloat16 run parts where it is smallest)."""
    import jax.numpy as jnp

    import vsurge

    ref = np.load(path)
    model, processor = vsurge.load("default", dtype=jnp.float32, progress=False)
    for i, (prompt, tokens) in enumerate(zip(prompt_ids(processor), ref["tokens"].tolist())):
        logits = np.asarray(model(jnp.asarray([prompt + tokens], jnp.int32))[0][0])[len(prompt) - 1:][:TOKENS]
        top = np.sort(logits, axis=-1)[:, -2:]
        gap = top[:, 1] - top[:, 0]
        print(f"prompt {i}: smallest top-two gap {gap.min():.3f} at token {int(gap.argmin())}")


def check(path: str) -> int:
    import jax
    import jax.numpy as jnp

    import vsurge
    from dense_generator import greedy_generate

    ref = np.load(path)
    weights = Path("/tmp/vsurge-weights")  # benchmarks/model_parts.py's word on the file it put together
    status = weights.read_text().strip() if weights.exists() else ""
    print(f"device: {jax.devices()[0].device_kind}; {status}", flush=True)
    if "NOT THE REAL ONES" in status:
        print("agreement not checked: the model file there is not the real one")
        return 2
    with jax.default_matmul_precision("highest"):
        model, processor = vsurge.load("default", dtype=jnp.float32, progress=False)
        assert logit_ids(processor) == ref["ids"].tolist(), "the tokenizer gave other ids than on the CPU"
        ours = np.asarray(model(jnp.asarray([ref["ids"]], jnp.int32))[0][0])
    diff = float(np.abs(ours[-KEPT_POSITIONS:] - ref["logits"]).max())
    same_argmax = bool((ours.argmax(-1) == ref["argmax"]).all())
    logits_ok = diff <= LOGIT_TOL and same_argmax
    print(f"float32 logits (matmul precision highest) vs transformers: max |diff| {diff:.2e} (must <= {LOGIT_TOL}), "
          f"argmax {'equal' if same_argmax else 'DIFFERS'} at every position: {'ok' if logits_ok else 'FAIL'}")
    del model
    model, processor = vsurge.load("default", dtype=jnp.bfloat16, progress=False)
    equal = 0
    for i, (prompt, want) in enumerate(zip(prompt_ids(processor), ref["tokens"].tolist())):
        got = greedy_generate(model, prompt, max_new_tokens=TOKENS)
        parted = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
        equal += parted is None
        print(f"prompt {i}: " + ("16/16 tokens equal" if parted is None else
                                 f"parts at token {parted}: {processor.decode(got)!r} vs CPU {processor.decode(want)!r}"))
    greedy_ok = equal >= MUST_EQUAL
    print(f"bfloat16 on {jax.devices()[0].device_kind} vs CPU float32, greedy: first {TOKENS} tokens equal on "
          f"{equal}/{PROMPTS} prompts (must >= {MUST_EQUAL}): {'ok' if greedy_ok else 'FAIL'}")
    return 0 if logits_ok and greedy_ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("reference", "check", "gaps"):
        raise SystemExit(__doc__)
    sys.exit({"reference": reference, "check": check, "gaps": gaps}[sys.argv[1]](sys.argv[2]))
