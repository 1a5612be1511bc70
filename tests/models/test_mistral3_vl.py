"""Mistral 3 (Pixtral tower) against transformers on a tiny random checkpoint (tower and projector included):
images fitted within the longest edge at their own aspect (the processor's pixels and [IMG] / [IMG_BREAK] /
[IMG_END] ids equal HF's), the tower's 2-D rotary, the feature layer, the patch merger and the projector
(logits with one and two images of different sizes equal the HF model's), and the paged engine's greedy
tokens equal HF's generate, prompts chunked across the images, with a text-only prompt beside them; with a
Mistral and a Ministral 3 (YaRN, query temperature) text model."""

from __future__ import annotations

import io
import sys
from unittest import mock

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from test_images import png
from tiny_vlm import write_tiny_mistral3
from vlm_checks import IMAGES, engine_matches_transformers, hf_generate, logits_with_images
from vsurge.loading import load
from vsurge.ops.vision import normalize_pixels

ONE = "[INST][IMG]Describe this[/INST]"
TWO = "[INST][IMG]and[IMG]compare them[/INST]"
TEXT = "[INST]What is the capital of France?[/INST]"


@pytest.fixture(scope="module", params=["mistral", "ministral3"])
def mistral3(request, tmp_path_factory, default_processor_dir):
    """(torch model, HF processor, our model, our processor) with each text model type."""
    import transformers
    from transformers.models.pixtral import image_processing_pil_pixtral as pil

    folder = tmp_path_factory.mktemp(f"mistral3_{request.param}")
    torch_model = write_tiny_mistral3(folder, default_processor_dir, text_type=request.param)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    # PixtralProcessor's module imports the torchvision image processor (for a function the PIL one has too), and
    # transformers' check of the image processor's class wants that backend: the PIL one is the reference here
    with mock.patch.dict(sys.modules, {"transformers.models.pixtral.image_processing_pixtral": pil}), \
            mock.patch.object(transformers.ProcessorMixin, "check_argument_for_proper_class", lambda *a: None):
        from transformers.models.pixtral.processing_pixtral import PixtralProcessor

        hf_processor = PixtralProcessor(image_processor=pil.PixtralImageProcessorPil.from_pretrained(folder),
                                        tokenizer=tokenizer, patch_size=8, spatial_merge_size=2)
    model, processor = load(str(folder), dtype="float32", progress=False)
    return torch_model, hf_processor, model, processor


def hf_inputs(hf_processor, text: str, images: list[bytes]):
    from PIL import Image

    return hf_processor(text=[text], images=[Image.open(io.BytesIO(b)) for b in images] or None, return_tensors="pt")


@pytest.mark.parametrize("mistral3", ["mistral"], indirect=True)  # (the processor is the text model's either way)
@pytest.mark.parametrize("size", [(50, 90), (120, 33), (20, 20)])
def test_pixels_and_tokens_equal_the_hf_processor(mistral3, size):
    """Wide and tall (scaled down to the longest edge), and small (rounded up to whole blocks, not scaled):
    HF's token ids (rows of [IMG] closed by [IMG_BREAK], the last by [IMG_END]), image size and pixel_values."""
    _, hf_processor, model, processor = mistral3
    data = png(*size, seed=sum(size))
    ours = processor.images.prompt(ONE, [data])
    ref = hf_inputs(hf_processor, ONE, [data])
    assert ours.ids == ref["input_ids"][0].tolist()
    item = ours.media[0]
    assert list(item.pixels.shape[1:3]) == ref["image_sizes"][0].tolist()
    c = model.config
    pixels = normalize_pixels(jnp.asarray(item.pixels), c.image_mean, c.image_std, c.rescale_factor)
    np.testing.assert_allclose(np.asarray(pixels), ref["pixel_values"].numpy(), atol=1e-6)


def test_logits_with_one_and_two_images_equal_transformers(mistral3):
    """Images of different sizes and aspects (HF pads them into one batch and masks each to itself) and text
    after them: HF's logits within 1e-4."""
    torch_model, hf_processor, model, processor = mistral3
    images = [png(50, 90, 1), png(70, 40, 2)]
    for text, ims in ((ONE, images[:1]), (TWO, images)):
        prompt = processor.images.prompt(text, ims)
        ref = hf_inputs(hf_processor, text, ims)
        assert prompt.ids == ref["input_ids"][0].tolist()
        with torch.no_grad():
            want = torch_model(**ref).logits[0].numpy()
        np.testing.assert_allclose(logits_with_images(model, prompt), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mistral3", ["ministral3"], indirect=True)  # (the logits test covers both text models)
def test_engine_greedy_tokens_equal_transformers(mistral3):
    """One image, two images of different sizes and a text-only prompt at once, prefilled in 8-token chunks that
    cut through the images' rows: HF's greedy tokens. Run again: the same tokens, no image encoded again."""
    torch_model, hf_processor, model, processor = mistral3
    jobs = [(ONE, list(IMAGES[:1])), (TWO, list(IMAGES)), (TEXT, [])]
    engine_matches_transformers(model, processor, jobs,
                                lambda t, ims: hf_generate(torch_model, hf_inputs(hf_processor, t, ims), 8))
