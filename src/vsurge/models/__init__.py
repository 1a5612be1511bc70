"""Model families (flax.nnx): one file each in families/, the pieces they share in parts/, and the registry of
what loads (registry.py)."""

from .families.llama import Llama
from .parts.base import CausalLM
from .registry import config_from_hf, family_for_gguf, family_for_hf, supported_architectures

LlamaForCausalLM = Llama  # the name earlier releases exported

__all__ = ["CausalLM", "Llama", "LlamaForCausalLM", "config_from_hf", "family_for_gguf", "family_for_hf",
           "supported_architectures"]
