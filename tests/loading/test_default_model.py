"""The embedded default GGUF (SmolLM2-135M-Instruct Q4_1) against transformers' own GGUF loader."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from conftest import CHAT_PROMPT
from reference_generation import greedy_reference

# Both sides dequantize the same Q4_1/Q8_0 blocks to float32, so the weights are
# bit-identical; what differs is summation order across 30 layers (XLA vs
# PyTorch kernels). On logits of magnitude ~40 that accumulates to ~1e-4; 2e-3
# (5e-5 relative) leaves head-room without hiding a wrong weight, which moves
# logits by O(1).
LOGIT_TOL = 2e-3


def test_config_from_gguf_metadata(default_model):
    c = default_model[0].config
    assert (c.architecture, c.num_layers, c.hidden_size, c.intermediate_size) == ("llama", 30, 576, 1536)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert c.rope_theta == 100000.0 and c.tie_word_embeddings
    assert not hasattr(default_model[0], "lm_head")


def test_chat_template_and_tokens_match_transformers(default_model, hf_reference):
    _, processor = default_model
    _, tokenizer = hf_reference
    ours = processor.apply_chat_template(CHAT_PROMPT, add_generation_prompt=True)
    theirs = tokenizer.apply_chat_template(CHAT_PROMPT, add_generation_prompt=True, tokenize=False)
    assert processor.apply_chat_template(CHAT_PROMPT, tokenize=False) == theirs
    assert ours == tokenizer.encode(theirs, add_special_tokens=False)


def test_logits_match_transformers_gguf_loader(default_model, hf_reference):
    model, processor = default_model
    torch_model, _ = hf_reference
    ids = processor.apply_chat_template(CHAT_PROMPT) + processor.encode(" The capital of France is Paris. 🗼 日本語")
    with torch.no_grad():
        ref = torch_model(torch.tensor([ids])).logits[0].numpy()
    ours = np.asarray(model(jnp.asarray([ids], jnp.int32))[0][0])
    diff = np.abs(ours - ref).max()
    assert diff <= LOGIT_TOL, f"max abs logit diff {diff}"
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


def test_32_greedy_tokens_identical_to_transformers(default_model, hf_reference):
    model, processor = default_model
    torch_model, _ = hf_reference
    prompt = processor.apply_chat_template(CHAT_PROMPT)
    ours = greedy_reference(model, prompt, 32)  # no stop: all 32 tokens
    with torch.no_grad():
        out = torch_model.generate(torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32,
                                   do_sample=False, eos_token_id=None, pad_token_id=2)
    theirs = out[0, len(prompt):].tolist()
    assert ours == theirs
    text = processor.decode(ours)
    assert text.startswith("The capital of France is Paris."), text
