"""vsurge: run and serve Llama-family language models with JAX."""

from .config import ModelConfig, RopeScaling
from .engine import ActiveRequest, DriverNotReadyError, QueueFullError, ReturnSample, oDriver, oEngine, vDriver, vEngine
from .kv.paged import PagedAttentionCache
from .paged.page_manager import HBMPageManager
from .errors import ModelLoadError, UnsupportedModelError, VsurgeError
from .loading import load
from .models import LlamaForCausalLM
from .sampling_params import SamplingParams
from .tokenizer import Processor
from .vsurge import vSurge, vSurgeRequest
from .vinference import (
    PromptOutput,
    SampleState,
    vInference,
    vInferenceConfig,
    vInferenceMetaData,
    vInferencePreCompileConfig,
)

__version__ = "0.1.0"

__all__ = [
    "load",
    "LlamaForCausalLM",
    "ModelConfig",
    "RopeScaling",
    "Processor",
    "SamplingParams",
    "PromptOutput",
    "SampleState",
    "vInference",
    "vInferenceConfig",
    "vInferenceMetaData",
    "vInferencePreCompileConfig",
    "vSurge",
    "vSurgeRequest",
    "vDriver",
    "vEngine",
    "oDriver",
    "oEngine",
    "PagedAttentionCache",
    "HBMPageManager",
    "ActiveRequest",
    "ReturnSample",
    "QueueFullError",
    "DriverNotReadyError",
    "ModelLoadError",
    "UnsupportedModelError",
    "VsurgeError",
]
