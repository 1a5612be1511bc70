"""Shared fixtures: the real default model (loaded once), its transformers reference, tiny models."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

CHAT_PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="session")
def default_gguf_path():
    from vsurge.loading import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def default_model(default_gguf_path):
    """(model, processor) of the embedded SmolLM2-135M-Instruct, float32."""
    import jax.numpy as jnp

    import vsurge

    return vsurge.load("default", dtype=jnp.float32, progress=False)


@pytest.fixture(scope="session")
def hf_reference(default_gguf_path):
    """transformers' own GGUF loader on the same file: (torch model, tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(default_gguf_path.parent), default_gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return model, tokenizer


@pytest.fixture(scope="session")
def default_processor_dir(tmp_path_factory, default_model):
    """tokenizer.json + tokenizer_config.json of the default model, written by our Processor."""
    folder = tmp_path_factory.mktemp("default_tokenizer")
    default_model[1].save_pretrained(folder)
    return folder
