"""Model families (flax.nnx), one file each, and the registry of what loads (registry.py)."""

from .base import CausalLM
from .llama import Llama
from .registry import config_from_hf, family_for_gguf, family_for_hf, supported_architectures

LlamaForCausalLM = Llama  # the name earlier releases exported

__all__ = ["CausalLM", "Llama", "LlamaForCausalLM", "config_from_hf", "family_for_gguf", "family_for_hf",
           "supported_architectures"]
