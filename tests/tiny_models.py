"""Tiny random-weight checkpoints written by transformers, for numerical comparisons."""

from __future__ import annotations

import shutil
from pathlib import Path

VOCAB = 49152  # the default model's tokenizer is copied next to every tiny model

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)

# name -> (transformers config class name, extra kwargs)
TINY_CONFIGS = {
    "llama": ("LlamaConfig", dict(rope_theta=10000.0)),
    "llama3_scaled": ("LlamaConfig", dict(
        rope_theta=500000.0, head_dim=32, max_position_embeddings=512,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 128})),
    "llama_tied_mha": ("LlamaConfig", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", dict(sliding_window=6)),
    "qwen2": ("Qwen2Config", dict(rope_theta=1000000.0)),
    "qwen3": ("Qwen3Config", dict(head_dim=24)),
}


def write_tiny_model(name: str, folder: Path, tokenizer_dir: Path, max_shard_size=None, seed: int = 0):
    """Save a random model of config `name` (safetensors) plus the default tokenizer into `folder`.

    Returns the torch model (float32, eval mode).
    """
    import torch
    import transformers

    cls_name, extra = TINY_CONFIGS[name]
    config = getattr(transformers, cls_name)(**{**COMMON, **extra})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms default to 1 and biases to 0: randomize them so they are tested
        for pname, param in model.named_parameters():
            if pname.endswith("norm.weight") or pname.endswith(".bias"):
                param.add_(0.1 * torch.randn_like(param))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / f, folder / f)
    return model
