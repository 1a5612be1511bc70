"""llama.cpp's split form of a vision-language model: the text GGUF plus the mmproj GGUF (`--mmproj`).

A tiny random SmolVLM (Idefics3) and Gemma 3 checkpoint (tests/tiny_vlm.py) are written as the pair
llama.cpp's converter writes (tests/mmproj_files.py, checked against the real converter by
benchmarks/families_vs_llamacpp.py --mmproj). Loaded through vsurge.load(text, mmproj=...), the pair
must be the model its HF directory loads as (which tests/multimodal/test_images.py checks against transformers):
the same config, prompt tokens and float32 logits with images; its greedy tokens through the engine
equal transformers' own; the text GGUF alone still loads as the text model; wrong pairs are refused
with what is wrong."""

from __future__ import annotations

import dataclasses
import functools

import gguf
import jax.numpy as jnp
import numpy as np
import pytest

from mmproj_files import write_pair
from test_images import GEMMA_ONE, GEMMA_TWO, PROMPT_ONE, PROMPT_TWO, gemma_reference, hf_greedy, png, serving
from test_mistral3_vl import ONE as MISTRAL_ONE, TWO as MISTRAL_TWO
from test_qwen_vl import ONE as QWEN_ONE, TWO as QWEN_TWO
from tiny_vlm import (write_tiny_gemma3_vlm, write_tiny_idefics3, write_tiny_mistral3, write_tiny_qwen2_5_vl,
                      write_tiny_qwen3_5_vl, write_tiny_qwen3_vl)
from vlm_checks import logits_with_images
from vsurge.errors import ModelLoadError, UnsupportedModelError
from vsurge.kv.dense import NoCache
from vsurge.loading import load

PROMPTS = {"idefics3": (PROMPT_ONE, PROMPT_TWO), "gemma3": (GEMMA_ONE, GEMMA_TWO), "qwen2_5_vl": (QWEN_ONE, QWEN_TWO),
           "qwen3_vl": (QWEN_ONE, QWEN_TWO), "qwen3_vl_moe": (QWEN_ONE, QWEN_TWO), "qwen3_5": (QWEN_ONE, QWEN_TWO), "mistral3": (MISTRAL_ONE, MISTRAL_TWO)}
# (Mistral 3 with Mistral Small's text model and the last tower block's features: llama.cpp's pair holds no
# vision_feature_layer, its converter keeps every block)
WRITERS = {"idefics3": write_tiny_idefics3, "gemma3": write_tiny_gemma3_vlm, "qwen2_5_vl": write_tiny_qwen2_5_vl,
           "qwen3_vl": write_tiny_qwen3_vl, "qwen3_vl_moe": functools.partial(write_tiny_qwen3_vl, moe=True),
           "qwen3_5": write_tiny_qwen3_5_vl, "mistral3": functools.partial(write_tiny_mistral3, feature_layer=-1)}
# the pair's image processor takes clip.cpp's limits where the mmproj says none (Qwen-VL: 8 to 4096 image
# tokens), not the tiny HF processor's own; the test's images fit both, so their tokens still agree
CLIP_LIMITS = {"qwen2_5_vl": {"min_pixels": 8 * 16 * 16, "max_pixels": 4096 * 16 * 16},
               "qwen3_vl": {"min_pixels": 8 * 16 * 16, "max_pixels": 4096 * 16 * 16},
               "qwen3_vl_moe": {"min_pixels": 8 * 16 * 16, "max_pixels": 4096 * 16 * 16},
               "qwen3_5": {"min_pixels": 8 * 16 * 16, "max_pixels": 4096 * 16 * 16}}


@dataclasses.dataclass
class Pair:
    family: str
    folder: object  # the HF directory
    text: object  # the two GGUF files
    mmproj: object
    torch_model: object
    hf: tuple  # (model, processor) loaded from the directory
    ours: tuple  # ... and from the pair


@pytest.fixture(scope="module", params=sorted(WRITERS))
def pair(request, tmp_path_factory, default_processor_dir, default_gguf_path):
    family = request.param
    root = tmp_path_factory.mktemp(f"mmproj_{family}")
    folder, text, mmproj = root / "hf", root / f"{family}.gguf", root / f"mmproj-{family}.gguf"
    torch_model = WRITERS[family](folder, default_processor_dir)
    write_pair(folder, text, mmproj, default_gguf_path)
    return Pair(family, folder, text, mmproj, torch_model, load(str(folder), dtype="float32", progress=False),
                load(text, dtype="float32", progress=False, mmproj=mmproj))


def _same(a, b) -> bool:
    """Equal, floats to float32's precision (GGUF stores them as float32)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-6)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


# (Qwen3-VL's dense pair reads its tower as the MoE one does; its text half: the text-alone test below)
@pytest.mark.parametrize("pair", sorted(set(WRITERS) - {"qwen3_vl"}), indirect=True)
def test_the_pair_is_the_hf_directorys_model(pair):
    """The same config (tower, tiles, image token, normalization), the same prompt tokens and logits with
    one and two images; and the images reach the text model (another image, other logits)."""
    (hf, hf_proc), (ours, our_proc) = pair.hf, pair.ours
    assert ours.config.architecture == hf.config.architecture
    # the GGUF's general.name; its start and end tokens are the tokenizer's (tokenizer_config.json's, where
    # config.json's may differ: the tiny Gemma 3 keeps Gemma's ids beside SmolLM2's tokenizer)
    skip = {"name", "bos_token_id", "eos_token_ids"}
    skip |= {"value_heads_tiled"}  # (the converter's qwen35 stores DeltaNet value heads tiled: the model reads either)
    differ = {f.name for f in dataclasses.fields(hf.config) if f.name not in skip
              and not _same(getattr(hf.config, f.name), getattr(ours.config, f.name))}
    assert not differ, {k: (getattr(hf.config, k), getattr(ours.config, k)) for k in differ}
    if pair.family in CLIP_LIMITS:
        assert {k: getattr(our_proc.images, k) for k in CLIP_LIMITS[pair.family]} == CLIP_LIMITS[pair.family]
    else:
        assert our_proc.images.signature() == hf_proc.images.signature()
    images = [png(50, 90, 1), png(70, 40, 2)]
    one, two = PROMPTS[pair.family]
    for text, ims in ((one, images[:1]), (two, images)):
        want, got = hf_proc.images.prompt(text, ims), our_proc.images.prompt(text, ims)
        assert got.ids == want.ids
        np.testing.assert_allclose(logits_with_images(ours, got), logits_with_images(hf, want), atol=1e-4, rtol=1e-4)
    first, other = (our_proc.images.prompt(one, [image]) for image in (images[0], png(50, 90, 7)))
    assert np.abs(logits_with_images(ours, other) - logits_with_images(ours, first)).max() > 1e-3


# (the engine runs a pair's model as its HF directory's, which the families' own tests run through it)
@pytest.mark.parametrize("pair", ["gemma3", "idefics3"], indirect=True)
def test_engine_greedy_tokens_equal_transformers(pair):
    """The pair through the paged engine (prompts chunked across the images): transformers' greedy tokens
    on the HF checkpoint (Gemma 3's with its images attending both ways)."""
    from vsurge import EngineConfig

    model, processor = pair.ours
    images = [png(50, 90, 1), png(70, 40, 2)]
    jobs = [(text, images[:n]) for text, n in zip(PROMPTS[pair.family], (1, 2))]
    steps = 5
    config = EngineConfig(max_slots=4, max_length=256, prefill_tokens=32, chunk_lengths=(8,), page_size=8,
                          decode_steps=4)
    with serving(model, processor, config, steps) as (_, run):
        got = run([processor.images.prompt(t, ims) for t, ims in jobs])
    if pair.family == "gemma3":
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

        reference = (pair.torch_model, model, processor, Gemma3ImageProcessorPil.from_pretrained(pair.folder))
        want = [gemma_reference(reference, t, ims, steps) for t, ims in jobs]
    else:
        import transformers
        from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

        hf_processor = transformers.Idefics3Processor(Idefics3ImageProcessorPil.from_pretrained(pair.folder),
                                                      transformers.AutoTokenizer.from_pretrained(pair.folder),
                                                      image_seq_len=4)
        want = [hf_greedy(pair.torch_model, hf_processor, t, ims, steps) for t, ims in jobs]
    assert got == want


# (Qwen3-VL-MoE's text half alone reads as the dense Qwen3-VL's does, through its text family's GGUF reading;
# Qwen3.5's is the qwen35 GGUF that tests/models/test_hybrid_families.py runs through the engine)
@pytest.mark.parametrize("pair", sorted(set(WRITERS) - {"qwen3_vl_moe", "qwen3_5"}), indirect=True)
def test_the_text_gguf_alone_is_the_text_model(pair):
    """Without its mmproj the text half loads as its text family (as llama.cpp's text-only use): same
    logits on a text prompt as the vision-language model's, no images."""
    model, processor = load(pair.text, dtype="float32", progress=False)
    hf, hf_proc = pair.hf
    assert not getattr(model, "accepts_images", False) and getattr(processor, "images", None) is None
    ids = hf_proc.encode("Describe the river and the mill", add_special_tokens=False)
    assert processor.encode("Describe the river and the mill", add_special_tokens=False) == ids

    def logits(m):
        out, _ = m.decode_layers(m.embed_tokens(jnp.asarray(ids)[None]), jnp.arange(len(ids))[None], NoCache())
        return np.asarray(m.logits(out))[0]

    np.testing.assert_allclose(logits(model), logits(hf), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pair", ["mistral3"], indirect=True)
def test_mistral_smalls_older_pair_is_the_same_model(pair, tmp_path, default_gguf_path, monkeypatch):
    """Mistral Small 3.1 / 3.2 as older converters wrote it (and today's from Mistral's own format): a `llama`
    text GGUF, and an mmproj with clip.cpp's copy of [IMG_BREAK]'s embedding: the same model."""
    import mmproj_files

    monkeypatch.setitem(mmproj_files.TEXT_ARCH, "mistral3", "llama")
    text, mmproj = tmp_path / "llama.gguf", tmp_path / "mmproj-img-break.gguf"
    mmproj_files.write_text_half(pair.folder, text, default_gguf_path)
    mmproj_files.with_img_break(pair.mmproj, text, mmproj)
    assert gguf.GGUFReader(text).fields["general.architecture"].contents() == "llama"
    model, _ = load(text, dtype="float32", progress=False, mmproj=mmproj)
    assert model.config == pair.ours[0].config
    weights, want = model.named_weights(), pair.ours[0].named_weights()
    assert set(weights) == set(want)
    for name, value in weights.items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(want[name]), err_msg=name)


def _gguf(path, arch: str, **fields) -> None:
    """A GGUF file of only metadata (what the pair's checks read before any tensor)."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in fields.items():
        w.add_string(key, value) if isinstance(value, str) else w.add_bool(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("pair", ["idefics3"], indirect=True)  # (one family's files suffice)
def test_wrong_pairs_are_refused_with_their_problem(pair, tmp_path, default_gguf_path):
    with pytest.raises(ModelLoadError, match="goes with the text model's GGUF file.*is a directory"):
        load(pair.folder, mmproj=pair.mmproj, progress=False)
    with pytest.raises(ModelLoadError, match="is not an mmproj file .*architecture 'llama'"):
        load(pair.text, mmproj=pair.text, progress=False)
    qwen = tmp_path / "qwen2.gguf"
    _gguf(qwen, "qwen2")
    with pytest.raises(UnsupportedModelError, match="architecture 'qwen2' has no vision-language family"):
        load(qwen, mmproj=pair.mmproj, progress=False)
    other = tmp_path / "mmproj-qwen2vl.gguf"
    _gguf(other, "clip", **{"clip.has_vision_encoder": True, "clip.projector_type": "qwen2vl"})
    with pytest.raises(UnsupportedModelError, match="projector type 'qwen2vl' is not supported; supported: gemma3"):
        load(pair.text, mmproj=other, progress=False)
    # Pixtral 12B's mmproj (its text half a `llama` too): no patch merger, not Mistral 3's
    pixtral = tmp_path / "mmproj-pixtral.gguf"
    _gguf(pixtral, "clip", **{"clip.has_vision_encoder": True, "clip.projector_type": "pixtral"})
    with pytest.raises(UnsupportedModelError, match="without the patch merger .* is Pixtral 12B's"):
        load(pair.text, mmproj=pixtral, progress=False)
    # the default model is a Llama too, but 576 wide: not this mmproj's other half
    with pytest.raises(ModelLoadError, match="projects images to width 64, but the text model's width is 576"):
        load(default_gguf_path, mmproj=pair.mmproj, progress=False)


@pytest.mark.parametrize("pair", ["idefics3"], indirect=True)
def test_the_command_line_names_a_wrong_pair(pair):
    """`vsurge generate --mmproj` with an HF directory, `vsurge serve --mmproj` with two models: an error
    line, no traceback."""
    from vsurge.cli import main

    with pytest.raises(SystemExit, match="vsurge: error: an mmproj goes with the text model's GGUF file"):
        main(["generate", "--model", str(pair.folder), "--mmproj", str(pair.mmproj), "--max-tokens", "1", "hi"])
    with pytest.raises(SystemExit, match="--mmproj goes with one --model"):
        main(["serve", "--model", str(pair.text), "--model", "default", "--mmproj", str(pair.mmproj)])
