"""Images into a vision-language model, against transformers on a tiny random Idefics3 (SmolVLM)
checkpoint: the image processor's tiles and token expansion equal HF's processor (PIL backend),
the tower's embeddings and the logits with one and two images equal Idefics3ForConditionalGeneration,
and the engine's greedy tokens equal HF's generate with prompts chunked across the images, the
prefix cache keyed by each image's content and the encoder cache reusing an image's embeddings."""

from __future__ import annotations

import asyncio
import contextlib
import io
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tiny_vlm import write_tiny_idefics3
from vsurge.kv.dense import NoCache
from vsurge.loading import load
from vsurge.multimodal import ImageError, MultimodalPrompt

PROMPT_ONE = "<|im_start|>User:<image>Describe this<end_of_utterance>\nAssistant:"
PROMPT_TWO = "<|im_start|>User:<image>and<image>compare them<end_of_utterance>\nAssistant:"


def png(height: int, width: int, seed: int, mode: str = "RGB", fmt: str = "PNG") -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode)
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def vlm(tmp_path_factory, default_processor_dir):
    """(folder, torch model, HF processor, our model, our processor)."""
    import transformers
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    folder = tmp_path_factory.mktemp("idefics3")
    torch_model = write_tiny_idefics3(folder, default_processor_dir)
    image_processor = Idefics3ImageProcessorPil.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    hf_processor = transformers.Idefics3Processor(image_processor, tokenizer, image_seq_len=4)
    model, processor = load(str(folder), dtype="float32", progress=False)
    return folder, torch_model, hf_processor, model, processor


def hf_inputs(hf_processor, text: str, images: list[bytes]):
    from PIL import Image

    return hf_processor(text=[text], images=[[Image.open(io.BytesIO(b)) for b in images]], return_tensors="pt")


@pytest.mark.parametrize("size,mode,fmt", [((50, 90), "RGB", "PNG"), ((120, 33), "RGB", "JPEG"),
                                           ((32, 32), "RGBA", "PNG"), ((20, 14), "L", "PNG"),
                                           ((64, 200), "RGB", "WEBP")])
def test_tiles_and_tokens_equal_the_hf_processor(vlm, size, mode, fmt):
    """Wide, tall, one-tile, transparent and grey images: the same token ids (tiles' tags and image tokens)
    and the same normalized pixels as transformers' Idefics3Processor."""
    _, _, hf_processor, model, processor = vlm
    data = png(*size, seed=sum(size), mode=mode, fmt=fmt)
    ours = processor.images.prompt(PROMPT_ONE, [data])
    ref = hf_inputs(hf_processor, PROMPT_ONE, [data])
    assert ours.ids == ref["input_ids"][0].tolist()
    c = model.config
    pixels = (ours.media[0].pixels.astype(np.float32) * np.float32(c.rescale_factor) - np.float32(0.5)) / np.float32(0.5)
    want = ref["pixel_values"][0].numpy()
    assert pixels.transpose(0, 3, 1, 2).shape == want.shape
    np.testing.assert_allclose(pixels.transpose(0, 3, 1, 2), want, atol=1e-6)


def test_low_detail_is_the_whole_image_as_transformers_without_splitting(vlm):
    """detail "low" (OpenAI's): the image as one tile, as transformers' processor with
    do_image_splitting=False (tokens and pixels), under its own cache key; "high" / "auto" cut it."""
    import transformers
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    folder, _, hf_processor, model, processor = vlm
    data = png(50, 90, seed=3)
    unsplit = transformers.Idefics3Processor(Idefics3ImageProcessorPil.from_pretrained(folder, do_image_splitting=False),
                                             hf_processor.tokenizer, image_seq_len=4)
    low = processor.images.prompt(PROMPT_ONE, [data], details=["low"])
    ref = hf_inputs(unsplit, PROMPT_ONE, [data])
    assert low.ids == ref["input_ids"][0].tolist()
    pixels = (low.media[0].pixels.astype(np.float32) * np.float32(model.config.rescale_factor) - np.float32(0.5)) / np.float32(0.5)
    np.testing.assert_allclose(pixels.transpose(0, 3, 1, 2), ref["pixel_values"][0].numpy(), atol=1e-6)
    high = processor.images.prompt(PROMPT_ONE, [data], details=["high"])
    assert high.ids == processor.images.prompt(PROMPT_ONE, [data], details=["auto"]).ids
    assert high.media[0].pixels.shape[0] > 1 == low.media[0].pixels.shape[0]
    assert low.media[0].key != high.media[0].key


def test_logits_with_one_and_two_images_equal_transformers(vlm):
    _, torch_model, hf_processor, model, processor = vlm
    images = [png(50, 90, 1), png(70, 40, 2)]
    for text, ims in ((PROMPT_ONE, images[:1]), (PROMPT_TWO, images)):
        prompt = processor.images.prompt(text, ims)
        ref_inputs = hf_inputs(hf_processor, text, ims)
        with torch.no_grad():
            want = torch_model(**ref_inputs).logits[0].numpy()
        hidden = model.embed_tokens(jnp.asarray(prompt.ids)[None])
        for item in prompt.media:
            hidden = hidden.at[0, item.positions].set(model.encode_images(jnp.asarray(item.pixels)))
        out, _ = model.decode_layers(hidden, jnp.arange(len(prompt.ids))[None], NoCache())
        got = np.asarray(model.logits(out))[0]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@contextlib.contextmanager
def serving(model, processor, config, steps: int):
    """A started paged vSurge and run(prompts) -> each prompt's greedy tokens, all submitted at once."""
    from vsurge import SamplingParams, vSurge

    surge = vSurge.create_odriver(model, processor, config=config)
    params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)

    async def batch(prompts):
        async def one(p):
            tokens = []
            async for samples in surge.submit(p, params, detokenize=False).updates():
                tokens += samples[0].token_ids
            return tokens
        return await asyncio.gather(*(one(p) for p in prompts))

    surge.compile()
    surge.start()
    try:
        yield surge, lambda prompts: asyncio.run(batch(prompts))
    finally:
        surge.stop(5)


def hf_greedy(torch_model, hf_processor, text, images, steps):
    inputs = hf_inputs(hf_processor, text, images)
    with torch.no_grad():
        out = torch_model.generate(**inputs, max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def test_engine_greedy_tokens_equal_transformers_with_the_caches(vlm):
    """Three prompts at once (one image, two images, the first image again in another conversation),
    prefilled in 16-token chunks that cut through images: HF's greedy tokens. Run again: the same tokens,
    no image encoded again (encoder cache), and the prompts' pages found in the prefix cache. A prompt
    with another image of the same size and the same text gets no page of the first one's image."""
    from vsurge import EngineConfig

    _, torch_model, hf_processor, model, processor = vlm
    images = [png(50, 90, 1), png(70, 40, 2), png(50, 90, 3)]
    other_text = "<|im_start|>User:<image>What is it?<end_of_utterance>\nAssistant:"
    jobs = [(PROMPT_ONE, images[:1]), (PROMPT_TWO, images[:2]), (other_text, images[:1])]
    prompts = [processor.images.prompt(t, ims) for t, ims in jobs]
    steps = 6
    config = EngineConfig(max_slots=4, max_length=256, prefill_tokens=32, chunk_lengths=(16,), page_size=16,
                          decode_steps=4)
    with serving(model, processor, config, steps) as (surge, run):
        got = run(prompts)
        media = surge.engine.media
        assert media.encoded == 2  # the first image once, though two prompts hold it
        pool = surge.engine.pool
        cached = [pool.cached_tokens(p.cache_ids()) for p in prompts]
        again = run(prompts)
        assert media.encoded == 2
        swapped = MultimodalPrompt(processor.images.prompt(PROMPT_ONE, images[2:]).ids,
                                   processor.images.prompt(PROMPT_ONE, images[2:]).media)
        first_image_at = int(prompts[0].media[0].positions[0])
        assert pool.cached_tokens(swapped.cache_ids()) <= first_image_at  # only the text before the image
        different = run([swapped])[0]
    want = [hf_greedy(torch_model, hf_processor, t, ims, steps) for t, ims in jobs]
    assert got == want
    assert again == want
    assert all(c >= 16 for c in cached)  # whole pages through the images are cached
    assert different == hf_greedy(torch_model, hf_processor, PROMPT_ONE, images[2:], steps)


def test_an_engine_that_compiles_after_ready_compiles_the_towers_buckets_in_the_background(vlm):
    """compile_at_start "serving" (an accelerator's default): the tower's tile buckets are not in start-up's
    programs but compile after ready (the first image request on a v5e had waited 50 s for them),
    and an image request gives transformers' tokens."""
    from vsurge import EngineConfig
    from vsurge.engine import deferred_programs
    from vsurge.engine.image_encoder import tile_buckets
    from vsurge.engine.program_kinds import VISION, kind_of

    _, torch_model, hf_processor, model, processor = vlm
    config = EngineConfig(max_slots=2, max_length=256, prefill_tokens=64, chunk_lengths=(64,), page_size=16,
                          decode_steps=2, compile_at_start="serving")
    image = png(50, 90, 1)
    with serving(model, processor, config, 4) as (surge, run):
        engine = surge.engine
        towers = [key for key in engine.buckets() if kind_of(key) is VISION]
        assert towers == [VISION.key(b) for b in tile_buckets()]
        assert not any(deferred_programs.at_start(engine, key) for key in towers)
        assert engine.deferred.keys[:len(towers)] == towers  # queued first: only an image request waits for them
        got = run([processor.images.prompt(PROMPT_ONE, [image])])
        assert engine.deferred.wait(120) and all(key in engine._compiled for key in towers)
    assert got == [hf_greedy(torch_model, hf_processor, PROMPT_ONE, [image], 4)]
    # compiling everything at start (a CPU's default) leaves each bucket to its first use
    all_at_start = SimpleNamespace(model=engine.model, media=engine.media,
                                   config=engine.config.replace(compile_at_start="all"))
    assert VISION.keys(all_at_start) == []


def test_bad_images_are_refused_with_their_problem(vlm):
    _, _, _, _, processor = vlm
    with pytest.raises(ImageError, match="could not be decoded"):
        processor.images.prompt(PROMPT_ONE, [b"not an image at all"])
    with pytest.raises(ImageError, match="could not be decoded"):
        processor.images.prompt(PROMPT_ONE, [png(40, 40, 0)[:60]])  # truncated
    with pytest.raises(ImageError, match="1 image placeholder"):
        processor.images.prompt(PROMPT_ONE, [png(40, 40, 0), png(40, 40, 1)])
    with pytest.raises(ImageError, match="format TIFF is not supported"):
        processor.images.prompt(PROMPT_ONE, [png(40, 40, 0, fmt="TIFF")])
    with pytest.raises(ImageError, match="is empty"):
        processor.images.prompt(PROMPT_ONE, [b""])


def test_a_text_model_refuses_images(default_model):
    from vsurge import EngineConfig, SamplingParams, vSurge
    from vsurge.multimodal import MediaItem

    surge = vSurge.create_odriver(*default_model, config=EngineConfig(max_slots=2, max_length=64,
                                                                      prefill_tokens=32, chunk_lengths=(16,)))
    prompt = MultimodalPrompt([1, 2, 3, 4], (MediaItem(7, np.asarray([1, 2]), np.zeros((1, 8, 8, 3), np.uint8)),))

    async def submit():
        surge.submit(prompt, SamplingParams(max_tokens=2))

    with pytest.raises(ValueError, match="image inputs are not supported by this model"):
        asyncio.run(submit())


# ---------------------------------------------------------------- Gemma 3: an image's tokens see the whole image
GEMMA_ONE = "<bos><start_of_turn>user\n<start_of_image>Describe this<end_of_turn>\n<start_of_turn>model\n"
GEMMA_TWO = "<bos><start_of_turn>user\n<start_of_image>and<start_of_image>compare<end_of_turn>\n<start_of_turn>model\n"


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory, default_processor_dir):
    """(torch model, our model, our processor, HF image processor)."""
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    from tiny_vlm import write_tiny_gemma3_vlm

    folder = tmp_path_factory.mktemp("gemma3_vl")
    torch_model = write_tiny_gemma3_vlm(folder, default_processor_dir)
    model, processor = load(str(folder), dtype="float32", progress=False)
    return torch_model, model, processor, Gemma3ImageProcessorPil.from_pretrained(folder)


def gemma_reference(gemma3, text, images, steps=None, blocks=True):
    """HF's logits (steps None) or greedy tokens, with the processor's token_type_ids (the image blocks;
    blocks False: without them, all causal)."""
    from PIL import Image

    torch_model, model, processor, image_processor = gemma3
    prompt = processor.images.prompt(text, images)
    ids = torch.tensor([prompt.ids])
    pixels = image_processor([Image.open(io.BytesIO(b)) for b in images], return_tensors="pt")["pixel_values"]
    kinds = (ids == model.config.image_token_id).long() if blocks else None
    with torch.no_grad():
        if steps is None:
            return torch_model(input_ids=ids, pixel_values=pixels, token_type_ids=kinds).logits[0].numpy()
        out = torch_model.generate(input_ids=ids, pixel_values=pixels, token_type_ids=kinds, max_new_tokens=steps,
                                   do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def test_gemma3_tokens_and_pixels_equal_the_references(gemma3):
    """Each <start_of_image> becomes HF's full image sequence (Gemma3Processor's), pixels equal its image
    processor's, and the tower and projector give HF's image features."""
    from PIL import Image

    torch_model, model, processor, image_processor = gemma3
    images = [png(50, 90, 1), png(70, 40, 2)]
    prompt = processor.images.prompt(GEMMA_TWO, images)
    sequence = "\n\n<start_of_image>" + "<image_soft_token>" * 4 + "<end_of_image>\n\n"
    assert prompt.ids == processor.encode(GEMMA_TWO.replace("<start_of_image>", sequence), add_special_tokens=False)
    pixels = image_processor([Image.open(io.BytesIO(b)) for b in images], return_tensors="pt")["pixel_values"]
    ours = np.stack([(m.pixels[0].astype(np.float32) / 255 - 0.5) / 0.5 for m in prompt.media])
    np.testing.assert_allclose(ours.transpose(0, 3, 1, 2), pixels.numpy(), atol=1e-6)
    with torch.no_grad():
        want = torch_model.model.get_image_features(pixels).pooler_output.reshape(-1, model.config.hidden_size)
    got = np.concatenate([np.asarray(model.encode_images(jnp.asarray(m.pixels))) for m in prompt.media])
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5, rtol=1e-5)  # (features of ~10: float32's 1e-6)


def test_gemma3_images_attend_both_ways_through_the_engine(gemma3):
    """Greedy tokens through the paged engine equal HF's with its bidirectional image blocks (which differ
    from causal ones), prompts chunked in 8-token rows across several steps: the scheduler keeps each image
    in one step. Run again, the prefix cache serves the pages; the same tokens come."""
    from vsurge import EngineConfig

    _, model, processor, _ = gemma3
    images = [png(50, 90, 1), png(70, 40, 2)]
    jobs = [(GEMMA_ONE, images[:1]), (GEMMA_TWO, images)]
    prompts = [processor.images.prompt(t, ims) for t, ims in jobs]
    steps = 6
    config = EngineConfig(max_slots=4, max_length=128, prefill_tokens=16, chunk_lengths=(8,), page_size=8,
                          decode_steps=4)
    with serving(model, processor, config, steps) as (_, run):
        got = run(prompts)
        again = run(prompts)
    want = [gemma_reference(gemma3, t, ims, steps) for t, ims in jobs]
    assert got == want
    assert again == want
    assert want != [gemma_reference(gemma3, t, ims, steps, blocks=False) for t, ims in jobs]  # (it matters)


def test_the_media_policy_decides_where_images_come_from(tmp_path):
    """data: URIs always; files only under the allowed folder; URLs only from allowed hosts (and their
    subdomains); a size cap on every source."""
    from vsurge.multimodal import MediaPolicy, image_bytes

    data = png(8, 8, 0)
    (tmp_path / "a.png").write_bytes(data)
    uri = "data:image/png;base64," + __import__("base64").b64encode(data).decode()
    assert image_bytes(uri, MediaPolicy()) == data
    with pytest.raises(ImageError, match="local image files are not allowed"):
        image_bytes(str(tmp_path / "a.png"), MediaPolicy())
    allowed = MediaPolicy(allowed_local_path=str(tmp_path))
    assert image_bytes(f"file://{tmp_path / 'a.png'}", allowed) == data
    with pytest.raises(ImageError, match="outside the allowed media folder"):
        image_bytes(str(tmp_path / ".." / "a.png"), allowed)
    with pytest.raises(ImageError, match="larger than the server's limit of 10 bytes"):
        image_bytes(uri, MediaPolicy(max_bytes=10))
    with pytest.raises(ImageError, match="larger than the server's limit of 10 bytes"):
        image_bytes(str(tmp_path / "a.png"), MediaPolicy(allowed_local_path=str(tmp_path), max_bytes=10))
    hosts = MediaPolicy(allowed_domains=("example.com",))
    assert hosts.domain_allowed("example.com") and hosts.domain_allowed("img.example.com")
    assert not hosts.domain_allowed("badexample.com") and not hosts.domain_allowed("example.com.evil.org")
    with pytest.raises(ImageError, match="not allowed by this server"):
        image_bytes("https://evil.org/a.png", hosts)
