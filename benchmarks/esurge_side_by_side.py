"""EasyDeL eSurge (the successor of the vSurge design) on a random-weight Llama, for side-by-side rows.

Builds an eSurge engine (PyPI `easydel` 0.3.0) on a Llama of the same shapes as
benchmarks/roofline.py's LLAMA_1B (or a tiny one for CPU smoke runs), with EasyDeL's own random
init in bfloat16, sends N prompts of `--prompt-len` tokens at once (greedy, EOS ignored,
`--output-len` tokens each) and prints one markdown row per stream count: output tok/s over the
wall time of `generate()` (submission to the last completion), TTFT p50 as eSurge reports it
(`RequestOutput.first_token_time`: seconds from a request's admission to its first token) and
the easydel version. A warm-up run of the same N precedes each timed run, on other prompts.

eSurge takes prompts as text only and tokenizes them in its own worker process, so the script
builds a word-level tokenizer (`tokenizers` WordLevel, vocabulary = the shape's vocab size:
`<unk> <s> </s> w3 ... w{V-1}`, whitespace split, no BOS added): a prompt of P words is
exactly P tokens. It is saved to a temporary folder, since the workers load it by path.

It does not import vsurge; run it in its own virtualenv (CPU) or with easydel's set in /tmp/site
(TPU: the wheels in .tpu-edl/, installed by .tpu-edl/install.sh; carry `.tpu-edl`):

    /tmp/edl-venv/bin/python benchmarks/esurge_side_by_side.py --shape tiny --streams 1,4 \
        --prompt-len 32 --output-len 8                                 # CPU smoke run
    bash .tpu-edl/install.sh /tmp/site && PYTHONPATH=$PYTHONPATH:/tmp/site \
        python3 benchmarks/esurge_side_by_side.py --shape 1b --streams 1,64  # on the TPU

On a TPU, eSurge sizes the KV cache as `--hbm-utilization` of free HBM but underestimates the
padded layout of small heads: the tiny shape (head_dim 16) asked 3.7x what it sized and ran out of
HBM at 0.85; there use about --hbm-utilization 0.2 (estimated, not run).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# `import easydel` otherwise calls jax.distributed.initialize() on a TPU VM, which asks the GCE metadata
# server for the topology (no network on the borrowed machine); one host needs none of it.
os.environ.setdefault("ENABLE_DISTRIBUTED_INIT", "0")
# EASYDEL_AUTO (on by default) appends GPU flags to XLA_FLAGS that JAX 0.10.2's XLA rejects on a TPU
# ("Unknown flag in XLA_FLAGS: --xla_gpu_enable_shared_constants", a fatal exit it also silences).
os.environ.setdefault("EASYDEL_AUTO", "0")

# Same shapes as benchmarks/roofline.py (LLAMA_8B -> LLAMA_1B, rope as there); TINY is for CPU.
LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                num_kv_heads=8, head_dim=64, rms_norm_eps=1e-5, max_position_embeddings=131072,
                rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                       high_freq_factor=4.0, original_max_position_embeddings=8192),
                tie_word_embeddings=True, name="random Llama-3.2-1B shape")
TINY = dict(LLAMA_1B, vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=16, name="tiny Llama (smoke)")
SHAPES = {"1b": LLAMA_1B, "tiny": TINY}
SPECIALS = ["<unk>", "<s>", "</s>"]


def build_tokenizer(vocab_size: int, folder: str):
    """A word-level fast tokenizer with `vocab_size` entries, saved to `folder` and reloaded from it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIALS), vocab_size)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<unk>")
    fast.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def build_model(shape: dict, max_model_len: int):
    """EasyDeL's own random init of a Llama of `shape`, bfloat16 weights and compute."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import easydel as ed

    config = ed.LlamaConfig(
        vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"], num_key_value_heads=shape["num_kv_heads"],
        head_dim=shape["head_dim"], rms_norm_eps=shape["rms_norm_eps"],
        max_position_embeddings=shape["max_position_embeddings"], rope_theta=shape["rope_theta"],
        rope_scaling=dict(shape["rope_scaling"]), tie_word_embeddings=shape["tie_word_embeddings"],
        bos_token_id=1, eos_token_id=2,
        # what eSurge itself sets when it loads a checkpoint by name (esurge_engine.py)
        attn_mechanism="ragged_page_attention_v3", attn_dtype=jnp.bfloat16, kvdtype=jnp.bfloat16,
        freq_max_position_embeddings=max_model_len, mask_max_position_embeddings=max_model_len,
    )
    return ed.AutoEasyDeLModelForCausalLM.from_config(
        config, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, precision=jax.lax.Precision.DEFAULT,
        rngs=nnx.Rngs(0),
    )


def prompts(n: int, length: int, vocab_size: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(len(SPECIALS), vocab_size)}" for _ in range(length)) for _ in range(n)]


def prompt_len(output) -> int:
    ids = output.prompt_token_ids  # one list per sample, or flat
    return len(ids[0] if ids and isinstance(ids[0], list) else ids)


def run(engine, texts: list[str], output_len: int):
    from easydel.inference import SamplingParams

    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outs = engine.generate(texts, params, use_tqdm=False)
    return outs, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--streams", default="1,64", help="comma-separated numbers of concurrent prompts")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--page-size", type=int, default=128, help="eSurge KV page size (its default: 128)")
    parser.add_argument("--max-batched-tokens", type=int, default=None,
                        help="eSurge max_num_batched_tokens (default: eSurge's own choice for the backend)")
    parser.add_argument("--hbm-utilization", type=float, default=0.85, help="eSurge's KV-cache memory share")
    parser.add_argument("--cpu-kv-mib", type=int, default=64,
                        help="KV-cache bytes on the CPU backend, where eSurge would take a fixed 4 GiB")
    parser.add_argument("--no-warmup", action="store_true")
    args = parser.parse_args(argv)

    import jax

    import easydel as ed
    from easydel.inference import eSurge

    if jax.default_backend() == "cpu":
        # JAX's CPU devices report no memory_stats, so easydel's budget helper falls back to a fixed
        # 4 GiB of pages (hbm_utilization ignored); size it here instead. Accelerators are untouched.
        from easydel.caching.ragged_page import cache as ragged_cache

        ragged_cache.per_device_hbm_budget_bytes = lambda *a, **k: args.cpu_kv_mib << 20
    shape = SHAPES[args.shape]
    streams = [int(s) for s in args.streams.split(",") if s]
    reserve = 16  # eSurge keeps prompt + new tokens + reserve_tokens <= max_model_len
    need = args.prompt_len + args.output_len + reserve
    max_model_len = -(-need // args.page_size) * args.page_size
    device = jax.devices()[0]
    kind = getattr(device, "device_kind", device.platform)
    print(f"easydel {ed.__version__}, jax {jax.__version__}, {kind}; {shape['name']}; "
          f"max_model_len {max_model_len}, page {args.page_size}", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="esurge-tok-") as folder:
        tokenizer = build_tokenizer(shape["vocab_size"], folder)
        model = build_model(shape, max_model_len)
        extra = {} if args.max_batched_tokens is None else {"max_num_batched_tokens": args.max_batched_tokens}
        engine = eSurge(
            model=model, processor=tokenizer, dtype=jax.numpy.bfloat16, max_model_len=max_model_len,
            max_num_seqs=max(streams), reserve_tokens=reserve, page_size=args.page_size,
            hbm_utilization=args.hbm_utilization, enable_prefix_caching=False, silent_mode=True, **extra,
        )
        rows = []
        try:
            for i, n in enumerate(streams):
                if not args.no_warmup:
                    run(engine, prompts(n, args.prompt_len, shape["vocab_size"], seed=1000 + i), args.output_len)
                outs, wall = run(engine, prompts(n, args.prompt_len, shape["vocab_size"], seed=i), args.output_len)
                generated = sum(len(o.outputs[0].token_ids) for o in outs)
                prompt_lens = {prompt_len(o) for o in outs}
                if generated != n * args.output_len or prompt_lens != {args.prompt_len}:
                    print(f"warning: {generated} tokens generated (wanted {n * args.output_len}), "
                          f"prompt lengths {sorted(prompt_lens)}", file=sys.stderr)
                ttfts = [o.first_token_time for o in outs if o.first_token_time is not None]
                ttft = f"{statistics.median(ttfts) * 1e3:.0f}" if ttfts else "n/a"
                rows.append(f"| eSurge (easydel {ed.__version__}) | {kind} | {args.shape} | {n} | {args.prompt_len} "
                            f"| {args.output_len} | {generated / wall:.1f} | {ttft} |")
        finally:
            engine.terminate()
    print("| engine | device | shape | streams | prompt | output | output tok/s | TTFT p50 ms |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
