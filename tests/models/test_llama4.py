"""Llama 4 beyond the tiny text checkpoint of test_models_vs_transformers.py: chunked local attention
(AttentionSpec.chunk) against an explicit block-diagonal causal mask, through the dense and paged
paths (decode rows on CPU must not take the C++ kernel, which knows windows only), and a whole
Llama 4 checkpoint (vision tower beside the text model) serving its text model."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import vsurge
from vsurge.config import AttentionSpec
from vsurge.kv import cpu_attention, kernels
from vsurge.kv.backends.columns import paged_attention
from vsurge.ops.attention import attend

CHUNK = 4


def reference(q, keys, values, q_pos, k_pos, scale, chunk):
    """q (B, T, H, d), keys / values (B, S, KVH, d) -> (B, T, H, d): softmax over the keys at k_pos <= q_pos
    in the query's chunk, written out with numpy."""
    b, t, h, d = q.shape
    g = h // keys.shape[2]
    out = np.zeros_like(q)
    for row in range(b):
        for i in range(t):
            p = q_pos[row, i]
            seen = (k_pos[row] <= p) & (k_pos[row] >= 0) & (k_pos[row] // chunk == p // chunk)
            for head in range(h):
                s = keys[row, seen, head // g] @ q[row, i, head] * scale
                w = np.exp(s - s.max())
                out[row, i, head] = (w / w.sum()) @ values[row, seen, head // g]
    return out


def qkv(rng, b, t, s, kv_heads=2, group=2, d=8):
    q = rng.normal(size=(b, t, kv_heads * group, d)).astype(np.float32)
    k = rng.normal(size=(b, s, kv_heads, d)).astype(np.float32)
    v = rng.normal(size=(b, s, kv_heads, d)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("t", [11, 1])
def test_chunked_attention_is_block_diagonal_causal(t):
    """A prompt (positions 0..10: chunks 0-3, 4-7, 8-10) and decode rows (one query per row at positions
    3, 4, 9, 15 over every key written so far) see only their own chunk's earlier keys."""
    rng = np.random.default_rng(0)
    s = 16
    q_pos = np.arange(t, dtype=np.int32)[None].repeat(2, 0) if t > 1 else np.asarray([[3], [4], [9], [15]], np.int32)
    b = q_pos.shape[0]
    q, k, v = qkv(rng, b, t, s)
    k_pos = np.broadcast_to(np.arange(s, dtype=np.int32), (b, s)).copy()
    if t > 1:
        k_pos[:, t:] = -1  # not written yet
    spec = AttentionSpec(scale=8 ** -0.5, chunk=CHUNK)
    got = attend(jnp.asarray(q), jnp.asarray(k).transpose(0, 2, 3, 1), jnp.asarray(v).swapaxes(1, 2),
                 jnp.asarray(q_pos), jnp.asarray(k_pos), spec)
    want = reference(q, k, v, q_pos, k_pos, spec.scale, CHUNK)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)
    full = attend(jnp.asarray(q), jnp.asarray(k).transpose(0, 2, 3, 1), jnp.asarray(v).swapaxes(1, 2),
                  jnp.asarray(q_pos), jnp.asarray(k_pos), AttentionSpec(scale=spec.scale))
    assert np.abs(np.asarray(full) - want).max() > 1e-2  # the chunks matter here


def test_paged_decode_rows_with_chunks_take_the_xla_path(monkeypatch):
    """Decode rows over scattered pages: the chunked spec gives the block-diagonal reference, so the
    C++ decode kernel (windows only) and the Pallas kernels are not chosen for it."""
    rng = np.random.default_rng(1)
    page, width, positions = 8, 3, [2, 8, 13, 21]
    rows, num_pages = len(positions), 3 * width
    q, _, _ = qkv(rng, rows, 1, 1)
    k_pages = rng.normal(size=(num_pages, 2, 8, page)).astype(np.float32)
    v_pages = rng.normal(size=(num_pages, 2, page, 8)).astype(np.float32)
    tables = np.zeros((rows, width), np.int32)
    for i, p in enumerate(positions):
        used = p // page + 1
        tables[i, :used] = rng.choice(np.arange(1, num_pages), used, replace=False)
    q_pos = np.asarray(positions, np.int32)[:, None]
    spec = AttentionSpec(scale=8 ** -0.5, chunk=CHUNK)
    # each row's keys and values in position order, gathered from its pages
    k_pos = np.broadcast_to(np.arange(width * page, dtype=np.int32), (rows, width * page))
    keys = k_pages[tables].transpose(0, 1, 4, 2, 3).reshape(rows, width * page, 2, 8)
    values = v_pages[tables].transpose(0, 1, 3, 2, 4).reshape(rows, width * page, 2, 8)
    want = reference(q, keys, values, q_pos, k_pos, spec.scale, CHUNK)
    got = jax.jit(lambda *a: paged_attention(*a, spec))(q, k_pages, v_pages, tables, q_pos)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)
    assert not cpu_attention.usable(jnp.asarray(q), jnp.asarray(k_pages), jnp.asarray(v_pages), spec)
    assert not kernels.gpu_serves(1, 8, 8, spec, None)  # local chunks: the XLA path on every backend
    assert kernels.gpu_serves(1, 8, 8, AttentionSpec(scale=spec.scale), None)


def test_a_whole_llama4_checkpoint_serves_its_text_model(tmp_path, default_processor_dir):
    """A Llama 4 checkpoint as released (Llama4ForConditionalGeneration) holds a vision tower and a
    projector beside the text model: the text model loads from `text_config` and language_model.*, and
    its logits equal transformers' on a text-only prompt."""
    import shutil

    import torch
    import transformers

    from tiny_models import COMMON, TINY_CONFIGS, VOCAB

    text = {**COMMON, **TINY_CONFIGS["llama4"][1]}
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                  vision_output_dim=32, image_size=28, patch_size=14, projector_input_dim=32, projector_output_dim=32)
    torch.manual_seed(0)
    reference_model = transformers.Llama4ForConditionalGeneration(
        transformers.Llama4Config(text_config=text, vision_config=vision)).eval()
    with torch.no_grad():  # norms default to 1: randomize them so the right ones are read
        for name, param in reference_model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
    reference_model.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_processor_dir / name, tmp_path / name)
    model, _ = vsurge.load(tmp_path, dtype=jnp.float32, progress=False)
    c = model.config
    assert (c.hf_prefix, c.hf_head) == ("language_model.model", "language_model.lm_head")
    assert c.moe_layers == (False, True, False, True) and c.rope_layers == (True, False, True, True)
    ids = np.random.default_rng(6).integers(0, VOCAB, 12)
    with torch.no_grad():
        expected = reference_model(torch.tensor(ids[None])).logits[0].numpy()
    logits, _ = model(jnp.asarray(ids[None], jnp.int32))
    assert np.abs(np.asarray(logits)[0] - expected).max() <= 1e-4
