"""Gemma 4 beyond the tiny text checkpoint of test_models_vs_transformers.py: a whole Gemma 4
checkpoint (vision tower beside the text model) serving its text model, and the paged engine giving
the reference tokens (KV-shared layers write their source layer's keys and values into their own
pages; per-layer inputs travel with the embeddings through the engine's programs)."""

from __future__ import annotations

import asyncio
import shutil

import jax.numpy as jnp
import pytest

import vsurge
from vsurge import EngineConfig, SamplingParams, vSurge
from vsurge.errors import UnsupportedModelError
from dense_generator import greedy_generate
from vsurge.models.registry import config_from_hf


def test_a_whole_gemma4_checkpoint_serves_its_text_model(tmp_path, default_processor_dir):
    """Gemma4ForConditionalGeneration holds a vision tower and its embedder beside the text model: the
    text model loads from `text_config` and model.language_model.*, and its logits equal transformers'
    on a text-only prompt."""
    import torch
    import transformers

    from test_models_vs_transformers import check_against_reference
    from tiny_models import COMMON, TINY_CONFIGS

    text = {**COMMON, **TINY_CONFIGS["gemma4"][1]}
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16)
    torch.manual_seed(0)
    reference_model = transformers.Gemma4ForConditionalGeneration(
        transformers.Gemma4Config(text_config=text, vision_config=vision, audio_config=None)).eval()
    with torch.no_grad():  # norms default to 1 and layer scalars to 1: randomize them so the right ones are read
        for name, param in reference_model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
        for name, buffer in reference_model.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.add_(0.1 * torch.randn_like(buffer))
    reference_model.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_processor_dir / name, tmp_path / name)
    model, _ = vsurge.load(tmp_path, dtype=jnp.float32, progress=False)
    c = model.config
    assert c.hf_prefix == "model.language_model" and c.tie_word_embeddings
    assert c.head_dims == (16, 16, 32, 16, 16, 32) and c.layer_kv_heads == (2, 2, 1, 2, 2, 1)
    assert c.kv_source == (None, None, None, None, 3, 2) and c.k_eq_v == (False, False, True, False, False, True)
    # a right-padded prefill of two text prompts, then 8 cached decode steps, within 1e-4 of transformers
    check_against_reference(model, reference_model, seed=6)


def test_unsupported_features_are_refused_at_load():
    base = {"model_type": "gemma4_text", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "vocab_size": 100, "intermediate_size": 128}
    with pytest.raises(UnsupportedModelError, match="enable_moe_block"):
        config_from_hf({**base, "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2})
    with pytest.raises(UnsupportedModelError, match="use_bidirectional_attention"):
        config_from_hf({**base, "use_bidirectional_attention": "all"})


PROMPTS = ["The ducks of the river ran past the old mill where the miller counted them every morning",
           "one two three one two three one two", "Hi", "A", "Seven bells rang over the town square at noon"]
CONFIG = dict(max_slots=3, max_length=64, prefill_tokens=16, chunk_lengths=(8,), row_buckets=(4,),
              window_buckets=(8,), page_size=8, decode_steps=4)
PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def test_the_paged_engine_gives_the_reference_tokens(tmp_path, default_processor_dir):
    """Five prompts on three slots; the longest (~18 tokens) takes several 8-token chunk rows, past the
    sliding window of 4, through the KV-shared layers."""
    from tiny_models import write_tiny_model

    write_tiny_model("gemma4", tmp_path, default_processor_dir)
    model, processor = vsurge.load(tmp_path, dtype=jnp.float32, progress=False)
    ids = [processor.encode(p) for p in PROMPTS]
    expected = [greedy_generate(model, p, PARAMS.max_tokens) for p in ids]
    assert max(len(p) for p in ids) > 16 and min(len(p) for p in ids) == 1
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(**CONFIG, num_pages=3 * 8))
    surge.compile()
    surge.start()
    try:
        got = [r.token_ids for r in asyncio.run(surge.generate(PROMPTS, PARAMS))]
    finally:
        surge.stop(5)
    assert got == expected
