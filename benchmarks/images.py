"""Image serving benchmark: `vsurge serve` (no flags) on a random-weight SmolVLM-256M-shaped checkpoint
(Idefics3: SigLIP-B/16 tower of 12 layers at 512 pixels, pixel shuffle 4 -> 64 tokens per tile, the
SmolLM2-135M language model), one run, the server alone on the machine:

    second turn         a chat about one 2048 x 2048 image (16 tiles + the whole image: ~1100 tokens):
                        TTFT of turn 1 (image encoded, prompt prefilled) against turn 2 (the conversation so
                        far and a new question: the image's pages come from the prefix cache), 3 images
    same image again    the same image in another conversation (another system prompt before it: no page in
                        common, the image's embeddings from the encoder cache, its tokens prefilled again)
    8 concurrent        8 requests at once, each with its own 512 x 512 image (one tile), 64 output tokens,
                        against 8 text-only requests of about the same prompt length

    python benchmarks/images.py [--write-readme]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import Server, isa_line, vsurge_cmd, write_readme  # noqa: E402

CACHE = Path(os.environ.get("VSURGE_BENCH_CACHE", Path.home() / ".cache" / "vsurge-bench")) / "smolvlm-256m-random"
WORDS = ("river stone garden window morning silver quiet lantern harbor meadow orchard candle thunder "
         "pebble forest").split()


def write_checkpoint(folder: Path) -> None:
    """SmolVLM-256M-Instruct's shapes with random weights (bfloat16), the default model's tokenizer plus
    the Idefics3 image tokens, and SmolVLM's processor settings."""
    import shutil

    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_models import add_special_tokens
    from tiny_vlm import IDEFICS3_TOKENS, SMOLVLM_TEMPLATE
    from vsurge.loading import load

    folder.mkdir(parents=True, exist_ok=True)
    _, processor = load("default", load_processor=True, progress=False)
    tokenizer_dir = folder / "tokenizer"
    processor.save_pretrained(tokenizer_dir)
    shutil.copy(tokenizer_dir / "tokenizer.json", folder / "tokenizer.json")
    ids = add_special_tokens(folder, IDEFICS3_TOKENS)
    tok_cfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    tok_cfg.pop("chat_template", None)
    tok_cfg["eos_token"] = "<end_of_utterance>"
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    (folder / "chat_template.jinja").write_text(SMOLVLM_TEMPLATE)
    text = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                num_key_value_heads=3, vocab_size=49280, rope_theta=100000.0, max_position_embeddings=8192,
                rms_norm_eps=1e-5, tie_word_embeddings=True, pad_token_id=2)
    vision = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                  image_size=512, patch_size=16)
    config = transformers.Idefics3Config(text_config=text, vision_config=vision, scale_factor=4,
                                         image_token_id=ids[1], tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.Idefics3ForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Idefics3ImageProcessor", "do_resize": True, "do_rescale": True,
        "do_normalize": True, "do_image_splitting": True, "resample": 1, "rescale_factor": 1 / 255,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "size": {"longest_edge": 2048},
        "max_image_size": {"longest_edge": 512}}))
    (folder / "processor_config.json").write_text(json.dumps({"image_seq_len": 64}))
    shutil.rmtree(tokenizer_dir)


def image(size: int, seed: int) -> str:
    """A photo-like JPEG (smooth colour fields plus a little noise) as a data: URI."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    phase = rng.uniform(0, 6.28, 3)
    fields = [np.sin(6 * x + phase[c]) * np.cos(4 * y - phase[c]) for c in range(3)]
    pixels = np.stack(fields, -1) * 100 + 128 + rng.normal(0, 8, (size, size, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


async def chat(client: httpx.AsyncClient, messages: list, max_tokens: int) -> dict:
    """One streamed chat request -> {ttft, seconds, tokens, prompt_tokens, text}."""
    start = time.perf_counter()
    ttft, text, usage = None, [], {}
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise SystemExit(f"HTTP {response.status_code}: {await response.aread()}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    text.append(piece)
    return {"ttft": ttft, "seconds": time.perf_counter() - start, "tokens": usage.get("completion_tokens", 0),
            "prompt_tokens": usage.get("prompt_tokens", 0), "text": "".join(text)}


def user(url: str | None, question: str) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": url}}] if url else []
    return {"role": "user", "content": parts + [{"type": "text", "text": question}]}


async def turns(base: str, images: int) -> dict:
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        first, second, again = [], [], []
        for k in range(images):
            url = image(2048, seed=k)
            turn1 = [user(url, "What is in this picture?")]
            one = await chat(client, turn1, 16)
            two = await chat(client, turn1 + [{"role": "assistant", "content": one["text"]},
                                              user(None, "And what colour is it?")], 16)
            # another conversation (another system prompt: no page in common) about the same image
            other = await chat(client, [{"role": "system", "content": "Answer in one word."},
                                        user(url, "Describe it.")], 16)
            first.append(one)
            second.append(two)
            again.append(other)
            print(f"image {k}: {one['prompt_tokens']} prompt tokens, TTFT turn 1 {one['ttft']:.2f} s, turn 2 "
                  f"{two['ttft']:.2f} s, new conversation {other['ttft']:.2f} s", flush=True)
    return {"first": first, "second": second, "again": again}


async def concurrent(base: str, n: int, with_images: bool, words: int, output: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        jobs = []
        for k in range(n):
            text = " ".join(rng.choice(WORDS, words)) + " Describe it."
            jobs.append([user(image(512, seed=1000 + seed + k) if with_images else None, text)])
        start = time.perf_counter()
        results = await asyncio.gather(*(chat(client, m, output) for m in jobs))
        wall = time.perf_counter() - start
    return {"tok_s": sum(r["tokens"] for r in results) / wall, "ttft": statistics.median(r["ttft"] for r in results),
            "prompt_tokens": statistics.median(r["prompt_tokens"] for r in results)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--write-readme", action="store_true")
    args = p.parse_args()
    print(isa_line(), flush=True)
    if not (CACHE / "model.safetensors").exists():
        print(f"writing the random checkpoint to {CACHE} ...", flush=True)
        write_checkpoint(CACHE)
    server = Server("vsurge", vsurge_cmd(f"--model {CACHE}"), "/readiness")
    try:
        ready = server.wait_ready()
        print(f"ready in {ready:.1f} s", flush=True)
        t = asyncio.run(turns(server.base, args.images))
        with_images = asyncio.run(concurrent(server.base, args.concurrency, True, 8, args.output_len, 0))
        words = 8 + int(with_images["prompt_tokens"]) - 80  # the image's ~70 tokens as words (~1 token each)
        text_only = asyncio.run(concurrent(server.base, args.concurrency, False, words, args.output_len, 1))
    finally:
        server.stop()
    med = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    t1, t2, t3 = med(t["first"], "ttft"), med(t["second"], "ttft"), med(t["again"], "ttft")
    lines = [f"`python benchmarks/images.py`, a random-weight SmolVLM-256M-shaped checkpoint (bfloat16), `vsurge serve` "
             f"without flags; {time.strftime('%Y-%m-%d')}, this {os.cpu_count()}-core machine ({isa_line()}), one run, "
             f"medians of {args.images} images.", "",
             "| measure | value | ratio |", "|---|---|---|",
             f"| turn 1 with a 2048 x 2048 image ({int(med(t['first'], 'prompt_tokens'))} prompt tokens): TTFT | "
             f"{t1:.2f} s | 1.00x |",
             f"| turn 2 about the same image ({int(med(t['second'], 'prompt_tokens'))} prompt tokens): TTFT | {t2:.2f} s "
             f"| {t2 / t1:.2f}x |",
             f"| the same image in another conversation (encoder cache, no prefix in common): TTFT | {t3:.2f} s | "
             f"{t3 / t1:.2f}x |",
             f"| {args.concurrency} concurrent, each its own 512 x 512 image ({int(with_images['prompt_tokens'])} prompt "
             f"tokens): tok/s | {with_images['tok_s']:.1f} | {with_images['tok_s'] / text_only['tok_s']:.2f}x |",
             f"| {args.concurrency} concurrent, text only ({int(text_only['prompt_tokens'])} prompt tokens): tok/s | "
             f"{text_only['tok_s']:.1f} | 1.00x |",
             f"| TTFT p50, images / text | {with_images['ttft']:.2f} / {text_only['ttft']:.2f} s | "
             f"{with_images['ttft'] / text_only['ttft']:.2f}x |"]
    text = "\n".join(lines)
    print(text)
    if args.write_readme:
        write_readme(text, "images-table")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
