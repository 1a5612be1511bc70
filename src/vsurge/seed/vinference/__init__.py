"""vInference: simple batch generation with precompiled buckets (the seed's first API)."""

from .inference_config import PromptOutput, vInferenceConfig, vInferenceMetaData, vInferencePreCompileConfig
from .state import SampleState
from .vinference import vInference

__all__ = ["PromptOutput", "SampleState", "vInference", "vInferenceConfig", "vInferenceMetaData",
           "vInferencePreCompileConfig"]
