"""vsurge's logits equal transformers' (PyTorch, float32) on tiny random checkpoints.

Prefill of a right-padded batch of two prompts, then 8 cached decode steps;
the reference runs each full sequence without a cache.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import vsurge
from vsurge.kv.dense import DenseKVCache
from tiny_models import TINY_CONFIGS, VOCAB, write_tiny_model

TOL = 1e-4
PROMPT_LENGTHS = (12, 7)
DECODE_STEPS = 8


def reference_logits(torch_model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return torch_model(torch.tensor(ids[None], dtype=torch.long)).logits[0].numpy()


def check_against_reference(model, torch_model, seed=0):
    rng = np.random.default_rng(seed)
    total = max(PROMPT_LENGTHS) + DECODE_STEPS
    seqs = [rng.integers(0, VOCAB, total) for _ in PROMPT_LENGTHS]
    refs = [reference_logits(torch_model, s[: n + DECODE_STEPS]) for s, n in zip(seqs, PROMPT_LENGTHS)]

    width = 16
    tokens = np.zeros((2, width), np.int32)
    for row, (s, n) in enumerate(zip(seqs, PROMPT_LENGTHS)):
        tokens[row, :n] = s[:n]
    cache = DenseKVCache.init(model.config.kv_layout, 2, 64).with_mode(True)
    logits, cache = model(jnp.asarray(tokens), cache=cache)
    logits = np.asarray(logits)
    for row, n in enumerate(PROMPT_LENGTHS):
        diff = np.abs(logits[row, :n] - refs[row][:n]).max()
        assert diff <= TOL, f"prefill row {row}: max abs diff {diff}"

    cache = cache.with_mode(False)
    for step in range(DECODE_STEPS):
        pos = np.array([[n + step] for n in PROMPT_LENGTHS], np.int32)
        tok = np.array([[s[n + step]] for s, n in zip(seqs, PROMPT_LENGTHS)], np.int32)
        logits, cache = model(jnp.asarray(tok), positions=jnp.asarray(pos), cache=cache)
        for row, n in enumerate(PROMPT_LENGTHS):
            diff = np.abs(np.asarray(logits)[row, 0] - refs[row][n + step]).max()
            assert diff <= TOL, f"decode step {step} row {row}: max abs diff {diff}"


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_logits_match_transformers(name, tmp_path, default_processor_dir):
    torch_model = write_tiny_model(name, tmp_path, default_processor_dir)
    model, processor = vsurge.load(tmp_path, dtype=jnp.float32, progress=False)
    assert torch_model.config.model_type in type(model).hf_model_types
    check_against_reference(model, torch_model)


def test_sharded_checkpoint_loads(tmp_path, default_processor_dir):
    torch_model = write_tiny_model("qwen2", tmp_path, default_processor_dir, max_shard_size="2MB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    model, _ = vsurge.load(tmp_path, dtype=jnp.float32, progress=False)
    check_against_reference(model, torch_model, seed=1)


def test_no_cache_forward_equals_reference(tmp_path, default_processor_dir):
    torch_model = write_tiny_model("llama", tmp_path, default_processor_dir)
    model, _ = vsurge.load(tmp_path, dtype=jnp.float32, progress=False)
    ids = np.random.default_rng(3).integers(0, VOCAB, 20)
    logits, _ = model(jnp.asarray(ids[None], jnp.int32))
    assert np.abs(np.asarray(logits)[0] - reference_logits(torch_model, ids)).max() <= TOL


def test_bfloat16_weights_stay_close(tmp_path, default_processor_dir):
    torch_model = write_tiny_model("llama", tmp_path, default_processor_dir)
    model, _ = vsurge.load(tmp_path, dtype=jnp.bfloat16, progress=False)
    assert model.embedding_table().dtype == jnp.bfloat16 and model.lm_head[...].dtype == jnp.bfloat16
    ids = np.random.default_rng(4).integers(0, VOCAB, 10)
    logits, _ = model(jnp.asarray(ids[None], jnp.int32))
    ref = reference_logits(torch_model, ids)
    # bfloat16 keeps ~3 significant digits; the random model's logits are ~O(0.1).
    assert np.abs(np.asarray(logits)[0] - ref).max() < 0.05 * np.abs(ref).max() + 1e-2
