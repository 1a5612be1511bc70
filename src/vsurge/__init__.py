"""vsurge: run and serve Llama-family language models with JAX."""

from .config import ModelConfig, RopeScaling
from .errors import ModelLoadError, UnsupportedModelError, VsurgeError
from .loading import load
from .models import LlamaForCausalLM
from .tokenizer import Processor

__version__ = "0.1.0"

__all__ = [
    "load",
    "LlamaForCausalLM",
    "ModelConfig",
    "RopeScaling",
    "Processor",
    "ModelLoadError",
    "UnsupportedModelError",
    "VsurgeError",
]
