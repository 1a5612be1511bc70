"""Checks the vision-language families' tests share: a prompt's float32 logits with its images' embeddings
fed at their tokens, transformers' greedy tokens, and the engine run twice over prompts with and without
images (the second run encodes no image again)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from test_images import png, serving
from vsurge.kv.dense import NoCache

IMAGES = (png(50, 90, 1), png(70, 40, 2))  # two images of different sizes (a wide one, a tall one)


def logits_with_images(model, prompt) -> np.ndarray:
    """(L, V) float32 logits of a whole prompt (causal throughout): each image's embeddings at its tokens, its
    deepstack features (Qwen3-VL) added after the first layers there, at the prompt's M-RoPE positions where
    it has them (Qwen-VL)."""
    d, length = model.config.hidden_size, len(prompt.ids)
    levels = getattr(model.config, "feature_levels", 1)
    hidden = model.embed_tokens(jnp.asarray(prompt.ids)[None])
    extra = jnp.zeros((levels - 1, 1, length, d))  # (K, 1, L, D)
    for item in prompt.media:
        features = model.encode_images(jnp.asarray(item.pixels))  # (tokens, levels * D)
        hidden = hidden.at[0, item.positions].set(features[:, :d])
        if levels > 1:
            extra = extra.at[:, 0, item.positions].set(features[:, d:].reshape(-1, levels - 1, d).transpose(1, 0, 2))
    kw = {} if prompt.rope is None else {"rope_positions": jnp.asarray(prompt.rope)[:, None]}
    out, _ = model.decode_layers(hidden, jnp.arange(length)[None], NoCache(),
                                 layer_inputs=extra if levels > 1 else None, **kw)
    return np.asarray(model.logits(out))[0]


def hf_generate(torch_model, inputs, steps: int) -> list[int]:
    """transformers' greedy tokens after the processor's `inputs` (no end token)."""
    with torch.no_grad():
        out = torch_model.generate(**inputs, max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def engine_matches_transformers(model, processor, jobs, want_of, steps: int = 8) -> None:
    """jobs: (text, images) pairs, the last one text only (given as token ids). Prefilled in 8-token chunks
    that cut through the images, then run again: both runs give want_of(text, images) for each job, and the
    second encodes no image. A model whose images keep their own size compiles each size's vision program
    on the engine's background thread (the image waits; the engine goes on with the rest)."""
    from vsurge import EngineConfig

    prompts = [processor.images.prompt(t, ims) for t, ims in jobs[:-1]]
    prompts.append(processor.encode(jobs[-1][0], add_special_tokens=False))
    config = EngineConfig(max_slots=4, max_length=128, prefill_tokens=16, chunk_lengths=(8,), page_size=8,
                          decode_steps=4)
    images = {item.key for p in prompts[:-1] for item in p.media}
    with serving(model, processor, config, steps) as (surge, run):
        got = run(prompts)
        again = run(prompts)
        assert surge.engine.media.encoded == len(images)
        if model.config.variable_images:
            vision = {key for key in surge.engine._compiled if key[0] == "vision"}
            assert vision and set(surge.engine.background_compiles) == vision
    want = [want_of(t, ims) for t, ims in jobs]
    assert got == want
    assert again == want
