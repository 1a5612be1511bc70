"""Perplexity of a fixed text: vsurge on the default GGUF (blocks kept, and dequantized to float32) vs llama.cpp.

llama.cpp's `llama-perplexity` (built beside llama-server by ../shared/peers/build-llama-server.sh)
scores benchmarks/data/perplexity.txt (~2.6k tokens) in chunks of --ctx tokens: each chunk is run
from an empty cache and the second half of its tokens is scored (the first half is context), as
its perplexity.cpp does. Its --kl-divergence-base file records the exact token ids it scored, so
vsurge scores the very same ids, chunk by chunk, the same way; tokenization is not part of the
comparison (the script reports whether vsurge's own tokenizer gives the same ids).

    python benchmarks/perplexity.py [--ctx 512] [--write-readme]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from serve import isa_line, llama_server_binary, write_readme  # noqa: E402

TEXT = HERE / "data" / "perplexity.txt"


def llama_perplexity(binary: str, gguf: Path, ctx: int) -> tuple[float, np.ndarray]:
    """llama.cpp's final PPL and the (chunks, ctx) token ids it scored."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.kld"
        proc = subprocess.run([str(Path(binary).parent / "llama-perplexity"), "-m", str(gguf), "-f", str(TEXT),
                               "-c", str(ctx), "-b", str(ctx), "-t", str(os.cpu_count() or 2),
                               "--kl-divergence-base", str(base)], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-2000:])
        found = re.search(r"Final estimate: PPL = ([0-9.]+)", proc.stderr + proc.stdout)
        if not found:
            raise RuntimeError("llama-perplexity printed no final estimate:\n" + proc.stderr[-2000:])
        raw = base.read_bytes()
    # the file: b"_logits_", n_ctx, n_vocab, n_chunk (int32 each), then n_chunk * n_ctx token ids (int32)
    assert raw[:8] == b"_logits_", "not a llama-perplexity logits file"
    n_ctx, _, n_chunk = np.frombuffer(raw, np.int32, 3, 8)
    tokens = np.frombuffer(raw, np.int32, n_chunk * n_ctx, 20).reshape(n_chunk, n_ctx)
    return float(found.group(1)), tokens


def vsurge_perplexity(model, tokens: np.ndarray, bos: int | None) -> float:
    """exp(mean NLL) over each chunk's second half, as llama-perplexity scores it."""
    import jax
    import jax.numpy as jnp

    n_ctx = tokens.shape[1]
    first = n_ctx // 2
    nll = []
    for chunk in tokens:
        ids = chunk.copy()
        if bos is not None:
            ids[0] = bos
        logits = np.asarray(model(jnp.asarray(ids[None], jnp.int32))[0][0], np.float64)  # (n_ctx, vocab)
        logp = np.asarray(jax.nn.log_softmax(logits[first:n_ctx - 1], axis=-1))
        nll.extend(-logp[np.arange(len(logp)), chunk[first + 1:]])
    return float(np.exp(np.mean(nll)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--write-readme", action="store_true")
    args = p.parse_args(argv)
    import jax.numpy as jnp

    import vsurge
    from vsurge.loading import default_model_path, load_processor

    print(isa_line(), flush=True)
    gguf = default_model_path()
    peer, tokens = llama_perplexity(llama_server_binary(), gguf, args.ctx)
    processor = load_processor("default")
    # llama.cpp tokenizes with its BOS first where the vocabulary adds one, and then puts BOS first in every chunk
    add_bos = processor.bos_token_id is not None and int(tokens[0, 0]) == processor.bos_token_id
    ours = processor.encode(TEXT.read_text())
    same_ids = list(ours[:tokens.size]) == tokens.ravel().tolist()
    print(f"llama-perplexity: PPL {peer:.4f} over {tokens.shape[0]} chunks of {args.ctx} (BOS first: {add_bos}); "
          f"vsurge's tokenizer gives the same ids: {same_ids}", flush=True)
    bos = processor.bos_token_id if add_bos else None
    rows = []
    for label, kwargs in [("vsurge, GGUF blocks kept (default)", {}),
                          ("vsurge, dequantized to float32 (`--dtype float32`)", {"dtype": jnp.float32})]:
        model, _ = vsurge.load(gguf, progress=False, **kwargs)
        ppl = vsurge_perplexity(model, tokens, bos)
        print(f"{label}: PPL {ppl:.4f} ({ppl / peer:.4f}x llama-perplexity)", flush=True)
        rows.append((label, ppl))
    lines = [f"`python benchmarks/perplexity.py`: default model (Q4_1 GGUF), benchmarks/data/perplexity.txt, "
             f"{tokens.shape[0]} chunks of {args.ctx} tokens, the second half of each scored; "
             f"{time.strftime('%Y-%m-%d')}, {isa_line()}.", "",
             "| engine | perplexity | vs llama-perplexity |", "|---|---|---|",
             f"| llama.cpp `llama-perplexity` | {peer:.4f} | 1.0000x |"]
    lines += [f"| {label} | {ppl:.4f} | {ppl / peer:.4f}x |" for label, ppl in rows]
    lines += ["", "Same token ids for all three (llama-perplexity's own, read from its --kl-divergence-base file); "
              f"vsurge's tokenizer gives the same ids: {'yes' if same_ids else 'no'}."]
    text = "\n".join(lines)
    print("\n" + text)
    if args.write_readme:
        write_readme(text, "perplexity-table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
