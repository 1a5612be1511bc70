"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE against transformers on tiny random checkpoints (towers included): images at
their own resolution (the processor's pixels, grid and tokens equal HF's), the towers (Qwen2.5-VL's
windows, Qwen3-VL's interpolated positions and deepstack features) and M-RoPE (logits with one and two
images of different sizes equal the HF models'), and the paged engine's greedy tokens equal HF's
generate, prompts chunked across the images, with a text-only prompt beside them."""

from __future__ import annotations

import functools
import io
import shutil
from unittest import mock

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from test_images import png
from tiny_vlm import write_tiny_qwen2_5_vl, write_tiny_qwen2_vl, write_tiny_qwen3_5_vl, write_tiny_qwen3_vl
from vlm_checks import IMAGES, engine_matches_transformers, hf_generate, logits_with_images
from vsurge.loading import load

ONE = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe this<|im_end|>\n<|im_start|>assistant\n"
TWO = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>and<|vision_start|><|image_pad|><|vision_end|>"
       "compare them<|im_end|>\n<|im_start|>assistant\n")
TEXT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


WRITERS = {"qwen2_vl": (write_tiny_qwen2_vl, "Qwen2VLProcessor"),
           "qwen2_5_vl": (write_tiny_qwen2_5_vl, "Qwen2_5_VLProcessor"),
           "qwen3_vl": (write_tiny_qwen3_vl, "Qwen3VLProcessor"),
           "qwen3_vl_moe": (functools.partial(write_tiny_qwen3_vl, moe=True), "Qwen3VLProcessor"),
           "qwen3_5": (write_tiny_qwen3_5_vl, "Qwen3VLProcessor")}
# (Qwen3.5-MoE is Qwen3.5's tower before the MoE text model, which the hybrid families' tests run; its
# images were checked once, logits within 1e-4 of transformers', and its pair against llama-server by
# benchmarks/families_vs_llamacpp.py --mmproj: left out for the suite's time)


@pytest.fixture(scope="module", params=list(WRITERS))
def qwen(request, tmp_path_factory, default_processor_dir):
    """(torch model, HF processor, our model, our processor) of each family."""
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    write, processor_class = WRITERS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    torch_model = write(folder, default_processor_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    # (no video processor: transformers' check of its class needs torchvision, which images do not use)
    with mock.patch.object(transformers.ProcessorMixin, "check_argument_for_proper_class", lambda *a: None):
        hf_processor = getattr(transformers, processor_class)(
            image_processor=Qwen2VLImageProcessorPil.from_pretrained(folder), tokenizer=tokenizer, video_processor=None)
    model, processor = load(str(folder), dtype="float32", progress=False)
    return torch_model, hf_processor, model, processor


def hf_inputs(hf_processor, text: str, images: list[bytes]):
    from PIL import Image

    return hf_processor(text=[text], images=[Image.open(io.BytesIO(b)) for b in images] or None, return_tensors="pt")


# (Qwen2-VL's processor is Qwen2.5-VL's, Qwen3-VL-MoE's Qwen3-VL's)
@pytest.mark.parametrize("qwen", ["qwen2_5_vl", "qwen3_vl"], indirect=True)
@pytest.mark.parametrize("size", [(50, 90), (120, 33), (16, 16), (300, 200)])
def test_pixels_grid_and_tokens_equal_the_hf_processor(qwen, size):
    """Wide, tall, smaller than min_pixels and larger than max_pixels: HF's token ids (one <|image_pad|> per
    merged block), grid and pixel_values (the patches the tower reads, in merge-block order)."""
    _, hf_processor, model, processor = qwen
    data = png(*size, seed=sum(size))
    ours = processor.images.prompt(ONE, [data])
    ref = hf_inputs(hf_processor, ONE, [data])
    assert ours.ids == ref["input_ids"][0].tolist()
    (_, rows, cols), = ref["image_grid_thw"].tolist()
    item = ours.media[0]
    p = model.config.patch_size
    assert item.pixels.shape[1:3] == (rows * p, cols * p)
    np.testing.assert_allclose(np.asarray(model.vision_patches(jnp.asarray(item.pixels))), ref["pixel_values"].numpy(),
                               atol=1e-6)


def test_logits_with_one_and_two_images_equal_transformers(qwen):
    """Images of different sizes and aspect ratios (windows cut at the edges) and text after them: HF's
    logits within 1e-4, M-RoPE positions and delta equal to its get_rope_index."""
    torch_model, hf_processor, model, processor = qwen
    images = [png(50, 90, 1), png(70, 40, 2)]
    for text, ims in ((ONE, images[:1]), (TWO, images)):
        prompt = processor.images.prompt(text, ims)
        ref = hf_inputs(hf_processor, text, ims)
        with torch.no_grad():
            want = torch_model(**ref).logits[0].numpy()
            positions, delta = torch_model.model.get_rope_index(ref["input_ids"], ref["mm_token_type_ids"],
                                                                ref["image_grid_thw"])
        np.testing.assert_array_equal(prompt.rope, positions[:, 0].numpy())
        assert prompt.rope_delta == int(delta)
        np.testing.assert_allclose(logits_with_images(model, prompt), want, atol=1e-4, rtol=1e-4)


# (Qwen2-VL's and Qwen3-VL-MoE's images reach the engine as Qwen2.5-VL's and Qwen3-VL's; Qwen3-VL-MoE's experts
# run there as Qwen3-MoE's, which the families' engine tests run: tests/models/test_families_engines.py)
@pytest.mark.parametrize("qwen", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"], indirect=True)
def test_engine_greedy_tokens_equal_transformers(qwen):
    """One image, two images of different sizes and a text-only prompt (token ids) at once, prefilled in 8-token chunks
    that cut through the images (their M-RoPE positions carried per chunk), decoded at position + rope
    delta: HF's greedy tokens. Run again: the same tokens, no image encoded again."""
    torch_model, hf_processor, model, processor = qwen
    jobs = [(ONE, list(IMAGES[:1])), (TWO, list(IMAGES)), (TEXT, [])]
    engine_matches_transformers(model, processor, jobs,
                                lambda t, ims: hf_generate(torch_model, hf_inputs(hf_processor, t, ims), 8))


def test_qwen3_vl_moe_reads_the_hubs_expert_layout_too(tmp_path, default_processor_dir):
    """The hub's Qwen3-VL-MoE checkpoints store each layer's experts (in, out) ((E, D, 2F), (E, F, D)), where
    transformers 5 saves them (out, in): both load as the same weights."""
    from safetensors.numpy import load_file, save_file

    saved, hub = tmp_path / "saved", tmp_path / "hub"
    write_tiny_qwen3_vl(saved, default_processor_dir, moe=True)
    shutil.copytree(saved, hub)
    state = load_file(hub / "model.safetensors")
    flipped = {k: np.ascontiguousarray(v.swapaxes(1, 2)) if k.endswith(("experts.gate_up_proj", "experts.down_proj"))
               else v for k, v in state.items()}
    assert any(flipped[k].shape != state[k].shape for k in state)
    save_file(flipped, str(hub / "model.safetensors"), metadata={"format": "pt"})
    ours, theirs = (load(str(f), dtype="float32", progress=False, load_processor=False)[0].named_weights()
                    for f in (saved, hub))
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_array_equal(np.asarray(ours[name]), np.asarray(theirs[name]), err_msg=name)
