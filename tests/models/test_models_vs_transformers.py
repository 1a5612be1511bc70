"""Every family's logits equal transformers' (PyTorch, float32) on tiny random checkpoints.

Prefill of a right-padded batch of two prompts, then 8 cached decode steps (one jitted program
each); the reference runs each full sequence without a cache. Greedy continuations equal
transformers' `generate`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import vsurge
from vsurge.kv.dense import DenseKVCache
from tiny_models import TINY_CONFIGS, VOCAB, family_name, write_tiny_model

TOL = 1e-4
PROMPT_LENGTHS = (12, 7)
DECODE_STEPS = 8


def reference_logits(torch_model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return torch_model(torch.tensor(ids[None], dtype=torch.long)).logits[0].numpy()


def jitted_forward(model):
    """model(tokens, positions, cache) as one compiled program per shape."""
    graphdef, state = nnx.split(model)
    run = jax.jit(lambda state, tokens, positions, cache: nnx.merge(graphdef, state)(tokens, positions, cache))
    return lambda tokens, positions, cache: run(state, jnp.asarray(tokens), jnp.asarray(positions), cache)


WIDTH = 16  # prefill width: both rows right-padded to it


def prefill(forward, model, prompts):
    """Two prompts (lists of ids) -> (prefill logits (2, WIDTH, V), decode-mode cache)."""
    tokens = np.zeros((2, WIDTH), np.int32)
    for row, ids in enumerate(prompts):
        tokens[row, :len(ids)] = ids
    positions = np.broadcast_to(np.arange(WIDTH, dtype=np.int32), (2, WIDTH))
    lengths = jnp.asarray([len(ids) for ids in prompts], jnp.int32)  # padding stays out of recurrent states
    cache = DenseKVCache.init(model.config.kv_layout, 2, 64, state_layout=model.config.state_layout)
    cache = cache.with_mode(True, lengths)
    logits, cache = forward(tokens, positions, cache)
    return np.asarray(logits), cache.with_mode(False, None)


def check_against_reference(model, torch_model, seed=0, forward=None):
    """Teacher-forced logits of two prompts, prefill then decode, against the uncached reference."""
    rng = np.random.default_rng(seed)
    total = max(PROMPT_LENGTHS) + DECODE_STEPS
    seqs = [rng.integers(0, VOCAB, total) for _ in PROMPT_LENGTHS]
    refs = [reference_logits(torch_model, s[: n + DECODE_STEPS]) for s, n in zip(seqs, PROMPT_LENGTHS)]
    forward = forward or jitted_forward(model)
    logits, cache = prefill(forward, model, [s[:n] for s, n in zip(seqs, PROMPT_LENGTHS)])
    for row, n in enumerate(PROMPT_LENGTHS):
        diff = np.abs(logits[row, :n] - refs[row][:n]).max()
        assert diff <= TOL, f"prefill row {row}: max abs diff {diff}"
    for step in range(DECODE_STEPS):
        pos = np.array([[n + step] for n in PROMPT_LENGTHS], np.int32)
        tok = np.array([[s[n + step]] for s, n in zip(seqs, PROMPT_LENGTHS)], np.int32)
        logits, cache = forward(tok, pos, cache)
        for row, n in enumerate(PROMPT_LENGTHS):
            diff = np.abs(np.asarray(logits)[row, 0] - refs[row][n + step]).max()
            assert diff <= TOL, f"decode step {step} row {row}: max abs diff {diff}"


def greedy_matches_generate(model, torch_model, prompt, forward, steps=DECODE_STEPS):
    """Our greedy continuation (the same compiled programs) equals transformers' generate."""
    with torch.no_grad():
        out = torch_model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False,
                                   pad_token_id=0, eos_token_id=None)
    expected = out[0, len(prompt):].tolist()
    logits, cache = prefill(forward, model, [prompt, prompt])
    token, got = int(logits[0, len(prompt) - 1].argmax()), []
    for step in range(steps):
        got.append(token)
        pos = np.full((2, 1), len(prompt) + step, np.int32)
        logits, cache = forward(np.full((2, 1), token, np.int32), pos, cache)
        token = int(np.asarray(logits)[0, 0].argmax())
    assert got == expected


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_logits_and_greedy_match_transformers(name, tiny_checkpoints):
    folder, torch_model = tiny_checkpoints[name]
    model, processor = vsurge.load(folder, dtype=jnp.float32, progress=False)
    assert family_name(name) in type(model).hf_model_types
    forward = jitted_forward(model)
    check_against_reference(model, torch_model, forward=forward)
    greedy_matches_generate(model, torch_model, processor.encode("The ducks of the river"), forward)


def test_every_family_has_a_tiny_checkpoint():
    """A family added to the registry without a tiny checkpoint here would go untested."""
    from vsurge.models.registry import families

    from tiny_vlm import VLM_MODEL_TYPES  # (the vision-language families' checkpoints: tests/multimodal/test_images.py)

    covered = {family_name(name) for name in TINY_CONFIGS} | set(VLM_MODEL_TYPES)
    for family in families():
        assert covered & set(family.hf_model_types), f"{family.__name__} has no tiny checkpoint"


def test_sharded_checkpoint_loads(tmp_path, default_processor_dir):
    torch_model = write_tiny_model("qwen2", tmp_path, default_processor_dir, max_shard_size="2MB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    model, _ = vsurge.load(tmp_path, dtype=jnp.float32, progress=False)
    check_against_reference(model, torch_model, seed=1)


def test_no_cache_forward_equals_reference(tiny_checkpoints):
    folder, torch_model = tiny_checkpoints["llama"]
    model, _ = vsurge.load(folder, dtype=jnp.float32, progress=False)
    ids = np.random.default_rng(3).integers(0, VOCAB, 20)
    logits, _ = model(jnp.asarray(ids[None], jnp.int32))
    assert np.abs(np.asarray(logits)[0] - reference_logits(torch_model, ids)).max() <= TOL


def test_bfloat16_weights_stay_close(tiny_checkpoints):
    folder, torch_model = tiny_checkpoints["llama"]
    model, _ = vsurge.load(folder, dtype=jnp.bfloat16, progress=False)
    assert model.embedding_table().dtype == jnp.bfloat16 and model.lm_head[...].dtype == jnp.bfloat16
    ids = np.random.default_rng(4).integers(0, VOCAB, 10)
    logits, _ = model(jnp.asarray(ids[None], jnp.int32))
    ref = reference_logits(torch_model, ids)
    # bfloat16 keeps ~3 significant digits; the random model's logits are ~O(0.1).
    assert np.abs(np.asarray(logits)[0] - ref).max() < 0.05 * np.abs(ref).max() + 1e-2


def test_longrope_long_factors_beyond_the_original_context(tiny_checkpoints):
    """Phi-3's LongRoPE: a context longer than the original (64 here) runs with the long factors,
    as transformers does for a sequence that long."""
    folder, torch_model = tiny_checkpoints["phi3"]
    model, _ = vsurge.load(folder, dtype=jnp.float32, progress=False)
    ids = np.random.default_rng(5).integers(0, VOCAB, 80)
    short = model.for_context(64)
    long = model.for_context(256)
    assert not short.config.rope.use_long_factor and long.config.rope.use_long_factor
    ref = reference_logits(torch_model, ids)  # 80 > 64 tokens: transformers switches to the long factors
    logits, _ = long(jnp.asarray(ids[None], jnp.int32))
    assert np.abs(np.asarray(logits)[0] - ref).max() <= TOL
    logits, _ = short(jnp.asarray(ids[None], jnp.int32))
    assert np.abs(np.asarray(logits)[0] - ref).max() > 10 * TOL  # the factors really differ
