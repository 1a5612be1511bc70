"""How far the quantized kernel's int8 activations move a matmul from the float product.

The kernel rounds x to int8 per 32-element block (scale = max |x| / 127, as llama.cpp's Q8
activations); the weights are used exactly. This takes the default model's own tensors (its
Q4_1 layers and Q8_0 embedding, read from the GGUF file as they are) and multiplies them by
activations of three kinds: Gaussian, Gaussian with a few large outlier channels (LLM hidden
states have some), and heavy-tailed (Student t, 3 degrees of freedom). Prints per tensor kind the
relative error ||kernel - float|| / ||float|| and the worst relative error of a row, against
x @ W^T in float64 with W from `gguf.quants.dequantize`.

    python benchmarks/quant_error.py [--rows 64]
"""

from __future__ import annotations

import argparse
import os
import sys

import gguf
import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def activations(kind: str, m: int, k: int, rng) -> np.ndarray:
    if kind == "gaussian":
        return rng.normal(0, 1, (m, k))
    if kind == "outlier channels":
        x = rng.normal(0, 1, (m, k))
        x[:, rng.choice(k, 4, replace=False)] *= 50  # 4 channels of 576 at 50 sigma
        return x
    return rng.standard_t(3, (m, k))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from vsurge import kernels
    from vsurge.loading import default_model_path
    from vsurge.loading.gguf_file import GGUFFile
    from vsurge.ops.quantized import from_gguf, qmatmul

    if not kernels.available():
        print(f"no kernel: {kernels.unavailable_reason()}")
        return 1
    path = default_model_path()
    tensors = {t.name: t for t in GGUFFile(path).tensors}
    names = ["blk.0.attn_q.weight", "blk.15.ffn_gate.weight", "blk.29.ffn_down.weight", "token_embd.weight"]
    rng = np.random.default_rng(0)
    program = jax.jit(qmatmul)
    print(f"{os.path.basename(path)}; kernel {kernels.variant()} ({kernels.cpu_isa()}); {args.rows} rows of x\n")
    print("| tensor | format | (N, K) | activations | relative error | worst row |")
    print("|---|---|---|---|---|---|")
    for name in names:
        t = tensors[name]
        raw = np.asarray(t.data)
        if name == "token_embd.weight":
            raw = raw[:8192]  # the tied output head's first 8192 rows
        w = from_gguf(raw, t.tensor_type)
        w_ref = gguf.quants.dequantize(raw, t.tensor_type).astype(np.float64)
        for kind in ("gaussian", "outlier channels", "student t (3)"):
            x = activations(kind, args.rows, w.shape[1], rng).astype(np.float32)
            y = np.asarray(program(jnp.asarray(x), w), np.float64)
            want = x.astype(np.float64) @ w_ref.T
            total = np.linalg.norm(y - want) / np.linalg.norm(want)
            rows = np.linalg.norm(y - want, axis=1) / np.linalg.norm(want, axis=1)
            print(f"| {name} | {t.tensor_type.name} | {w.shape} | {kind} | {total:.4f} | {rows.max():.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
