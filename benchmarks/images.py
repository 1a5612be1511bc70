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

With --llama, llama.cpp's `llama-server --mmproj` (continuous batching, `-np 8`) serves the same
checkpoint converted by llama.cpp's own converter (text GGUF + mmproj GGUF, bfloat16) under the same
loads, and the table gets its column and the ratios.

    python benchmarks/images.py [--llama] [--write-readme]

With --tower, what bounds the 8-concurrent ratio instead: the tower's arithmetic per image (SmolVLM cuts a
512 x 512 image, upscaled to 2048, into 16 tiles plus the whole image: 17 x 1024 patches through 12 blocks)
against the text model's per prompt token, and the rate the tower program reaches on this CPU.

    python benchmarks/images.py --tower
"""

from __future__ import annotations

import argparse
import asyncio
import base64
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

from vsurge.cli.bench_serve import photo_jpeg  # noqa: E402

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
    from tiny_vlm import write_idefics3_tokenizer
    from vsurge.loading import load

    _, processor = load("default", load_processor=True, progress=False)
    tokenizer_dir = folder / "tokenizer"
    processor.save_pretrained(tokenizer_dir)
    ids = write_idefics3_tokenizer(folder, tokenizer_dir)
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
    config_path = folder / "config.json"  # the text model's architecture, as the hub's SmolVLM checkpoints name it
    saved = json.loads(config_path.read_text())
    saved["text_config"]["architectures"] = ["LlamaForCausalLM"]
    config_path.write_text(json.dumps(saved, indent=2))
    shutil.rmtree(tokenizer_dir)


def image(size: int, seed: int) -> str:
    """A photo-like JPEG as a data: URI (`vsurge bench serve --images-per-request`'s images)."""
    return "data:image/jpeg;base64," + base64.b64encode(photo_jpeg(size, size, seed)).decode()


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
                if piece is not None:  # (a random model's special tokens may stream as empty text)
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    text.append(piece)
    if ttft is None:  # no content event at all: the whole answer came at the end
        ttft = time.perf_counter() - start
    return {"ttft": ttft, "seconds": time.perf_counter() - start, "tokens": usage.get("completion_tokens", 0),
            "prompt_tokens": usage.get("prompt_tokens", 0), "text": "".join(text)}


def client_for(server: Server) -> httpx.AsyncClient:
    """A connection per request: llama-server drops a kept-alive connection after a streamed answer."""
    return server.async_client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0))


def user(url: str | None, question: str) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": url}}] if url else []
    return {"role": "user", "content": parts + [{"type": "text", "text": question}]}


async def turns(server: Server, images: int) -> dict:
    async with client_for(server) as client:
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


async def concurrent(server: Server, n: int, with_images: bool, words: int, output: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    async with client_for(server) as client:
        jobs = []
        for k in range(n):
            text = " ".join(rng.choice(WORDS, words)) + " Describe it."
            jobs.append([user(image(512, seed=1000 + seed + k) if with_images else None, text)])
        start = time.perf_counter()
        results = await asyncio.gather(*(chat(client, m, output) for m in jobs))
        wall = time.perf_counter() - start
    return {"tok_s": sum(r["tokens"] for r in results) / wall, "ttft": statistics.median(r["ttft"] for r in results),
            "prompt_tokens": statistics.median(r["prompt_tokens"] for r in results)}


def convert_for_llamacpp(folder: Path) -> tuple[Path, Path]:
    """(text GGUF, mmproj GGUF) of the checkpoint by llama.cpp's convert_hf_to_gguf.py (cached beside it)."""
    import subprocess

    from serve import llama_server_binary

    source = Path(llama_server_binary()).resolve().parents[2]  # the llama.cpp tree the binary was built in
    text, mmproj = folder / "llamacpp-text-bf16.gguf", folder / "llamacpp-mmproj-bf16.gguf"
    env = {**os.environ, "PYTHONPATH": str(source / "gguf-py")}
    for out, extra in ((text, []), (mmproj, ["--mmproj"])):
        if not out.exists():
            subprocess.run([sys.executable, str(source / "convert_hf_to_gguf.py"), str(folder), "--outfile", str(out),
                            "--outtype", "bf16", *extra], check=True, env=env)
    return text, mmproj


def words_like(with_images: dict) -> int:
    """Words for a text-only prompt as long as the image requests' (the image's tokens as words, ~1 token each)."""
    return 8 + int(with_images["prompt_tokens"]) - 80


def measure(server: Server, args) -> dict:
    t = asyncio.run(turns(server, args.images))
    if args.warm:  # a first pass of both loads (other images, other words): programs first met here compile now
        first = asyncio.run(concurrent(server, args.concurrency, True, 8, args.output_len, 100))
        first_text = asyncio.run(concurrent(server, args.concurrency, False, words_like(first), args.output_len, 101))
        print(f"first pass: with images {first['tok_s']:.1f} tok/s (TTFT p50 {first['ttft']:.2f} s), text "
              f"{first_text['tok_s']:.1f} tok/s (TTFT p50 {first_text['ttft']:.2f} s)", flush=True)
    waited = server.wait_compiled()  # a background compile shares the host with the measured steps
    print(f"{server.name}: the background programs were compiled {waited:.1f} s later", flush=True)
    with_images = asyncio.run(concurrent(server, args.concurrency, True, 8, args.output_len, 0))
    text_only = asyncio.run(concurrent(server, args.concurrency, False, words_like(with_images), args.output_len, 1))
    return {"turns": t, "images": with_images, "text": text_only}


def tower_bound(concurrency: int) -> None:
    """The tower's multiply-adds per image against a text request's, and its program's rate here."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import vsurge

    model, processor = vsurge.load(str(CACHE), progress=False)  # (bfloat16, as `vsurge serve` loads it)
    c = model.config
    tiles = len(processor.images.prompt("<image>", [photo_jpeg(512, 512, 0)]).media[0].pixels)
    patches, dv, f = (c.tile_size[0] // c.patch_size) ** 2, c.vision_hidden, c.vision_intermediate
    per_patch = c.vision_layers * 2 * (4 * dv * dv + 2 * dv * f + 2 * patches * dv)  # projections, MLP, attention
    tower = tiles * patches * per_patch
    text_params = sum(int(np.prod(w.shape)) for name, w in model.named_weights().items()
                      if not name.startswith("vision") and name != "embed")
    text = tiles * c.tokens_per_tile * 2 * text_params  # the same prompt tokens through the text model
    graph, state = nnx.split(model)
    encode = jax.jit(lambda s, px: nnx.merge(graph, s).encode_images(px))
    px = jnp.asarray(np.random.default_rng(0).integers(0, 255, (tiles, *c.tile_size, 3), dtype=np.uint8))
    encode(state, px).block_until_ready()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        encode(state, px).block_until_ready()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    print(f"{isa_line()}; one 512 x 512 image: {tiles} tiles, {tiles * c.tokens_per_tile} prompt tokens")
    print(f"tower: {tower / 1e12:.2f} TFLOP in {seconds:.1f} s ({tower / seconds / 1e9:.0f} GFLOP/s); the text "
          f"model on as many prompt tokens: {text / 1e12:.2f} TFLOP (the tower's: {tower / text:.1f}x that)")
    print(f"so an image request's prompt costs {(tower + text) / text:.1f}x a text request's of as many tokens, and "
          f"{concurrency} of them {concurrency * seconds:.0f} s of tower time on this CPU beside the decode "
          "both kinds share")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--llama", action="store_true", help="llama-server --mmproj on the same checkpoint, same loads")
    p.add_argument("--write-readme", action="store_true")
    p.add_argument("--tower", action="store_true", help="the tower's arithmetic and rate (what bounds the ratio)")
    p.add_argument("--model", default=str(CACHE), help="the checkpoint (written here first when it is the cache's; "
                                                       "benchmarks/model_skeleton.py carries it to another machine)")
    p.add_argument("--uds", action="store_true", help="vsurge serve on a unix socket (a machine with no TCP)")
    p.add_argument("--warm", action="store_true", help="run the concurrent loads once before the measured pass")
    args = p.parse_args()
    print(isa_line(), flush=True)
    model = Path(args.model)
    if model == CACHE and not (CACHE / "model.safetensors").exists():
        print(f"writing the random checkpoint to {CACHE} ...", flush=True)
        write_checkpoint(CACHE)
    if args.tower:
        tower_bound(args.concurrency)
        return 0
    servers = [("vsurge", vsurge_cmd(f"--model {model}", uds=args.uds), "/readiness")]
    if args.llama and args.uds:
        raise SystemExit("--llama: llama-server listens on TCP only; leave out --uds")
    if args.llama:
        from serve import llama_server_binary

        text_gguf, mmproj = convert_for_llamacpp(CACHE)
        servers.append(("llama-server", [llama_server_binary(), "-m", str(text_gguf), "--mmproj", str(mmproj), "--port",
                                         "{port}", "-np", str(args.concurrency), "-c", str(2048 * args.concurrency),
                                         "-t", str(os.cpu_count()), "--no-webui"], "/health"))
    results = {}
    for name, cmd, ready_path in servers:
        server = Server(name, cmd, ready_path, uds=args.uds and name == "vsurge")
        try:
            print(f"{name} ready in {server.wait_ready():.1f} s", flush=True)
            results[name] = measure(server, args)
        finally:
            server.stop()
    print(json.dumps(results, default=float), flush=True)  # (the raw numbers, should the table fail)
    text = table(results, args)
    print(text)
    if args.write_readme:
        write_readme(text, "images-table")
    return 0


def table(results: dict, args) -> str:
    med = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    names = list(results)
    rows = {}  # measure -> {server: value}
    for name, r in results.items():
        t, im, tx = r["turns"], r["images"], r["text"]
        t1 = med(t["first"], "ttft")
        rows.setdefault("prompt tokens of turn 1 (the image and a question)", {})[name] = med(t["first"], "prompt_tokens")
        rows.setdefault("turn 1 about a 2048 x 2048 image: TTFT s", {})[name] = t1
        rows.setdefault("turn 2 about it, the conversation so far + a question: TTFT s", {})[name] = \
            med(t["second"], "ttft")
        rows.setdefault("the same image in another conversation (no prefix in common): TTFT s", {})[name] = \
            med(t["again"], "ttft")
        rows.setdefault(f"{args.concurrency} concurrent, each its own 512 x 512 image: tok/s", {})[name] = im["tok_s"]
        rows.setdefault(f"{args.concurrency} concurrent, text of as many tokens: tok/s", {})[name] = tx["tok_s"]
        rows.setdefault(f"{args.concurrency} concurrent with images: TTFT p50 s", {})[name] = im["ttft"]
        rows.setdefault(f"{args.concurrency} concurrent, text: TTFT p50 s", {})[name] = tx["ttft"]
    v = results["vsurge"]
    own = {"turn 2 / turn 1": med(v["turns"]["second"], "ttft") / med(v["turns"]["first"], "ttft"),
           "images / text tok/s": v["images"]["tok_s"] / v["text"]["tok_s"]}
    command = "python benchmarks/images.py " + " ".join(sys.argv[1:])
    lines = [f"`{command.strip()}`, a random-weight SmolVLM-256M-shaped "
             f"checkpoint (bfloat16; llama-server: the same converted by llama.cpp's converter), default flags; "
             f"{time.strftime('%Y-%m-%d')}, this {os.cpu_count()}-core machine ({isa_line()}), one run, medians of "
             f"{args.images} images.", "",
             "| measure | " + " | ".join(names) + (" | vsurge / llama-server |" if len(names) > 1 else " |"),
             "|---" * (len(names) + 1 + (len(names) > 1)) + "|"]
    for measure_name, values in rows.items():
        cells = [f"{values[n]:.0f}" if measure_name.startswith("prompt tokens") else f"{values[n]:.2f}"
                 for n in names]
        ratio = f" | {values['vsurge'] / values['llama-server']:.2f}x" if len(names) > 1 else ""
        lines.append(f"| {measure_name} | " + " | ".join(cells) + ratio + " |")
    lines += ["", f"vsurge against itself: turn 2's TTFT is {own['turn 2 / turn 1']:.2f}x turn 1's; requests with "
              f"images make {own['images / text tok/s']:.2f}x the tok/s of text requests as long (the tower's work)."]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
