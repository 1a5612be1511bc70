"""Model definitions (flax.nnx) and the table of supported architectures."""

from .llama import LlamaForCausalLM, weight_shapes
from .registry import SUPPORTED_ARCHITECTURES, config_from_hf

__all__ = ["LlamaForCausalLM", "weight_shapes", "SUPPORTED_ARCHITECTURES", "config_from_hf"]
