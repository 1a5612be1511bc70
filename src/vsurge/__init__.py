"""vsurge: run and serve Llama-family language models with JAX.

Names are imported on first use (PEP 562), so `import vsurge` is instant and the
pure-Python parts (scheduler, page manager, CLI argument parsing) never load JAX.
"""

from .lazy_exports import lazy_getattr

__version__ = "0.1.0"

# public name -> module that defines it (relative to this package)
_EXPORTS = {
    "load": ".loading",
    "LlamaForCausalLM": ".models",
    "ModelConfig": ".config",
    "Rope": ".config",
    "Processor": ".tokenizer",
    "SamplingParams": ".sampling.params",
    "StructuredOutput": ".structured.spec",
    "EngineConfig": ".engine.engine_config",
    "vSurge": ".seed.vsurge_api",
    "vSurgeRequest": ".vsurge",
    "vSurgeApiServer": ".server",
    # the seed's classes (EasyDeL's names): this package root is their one door
    "PromptOutput": ".seed.vinference",
    "SampleState": ".seed.vinference",
    "vInference": ".seed.vinference",
    "vInferenceConfig": ".seed.vinference",
    "vInferenceMetaData": ".seed.vinference",
    "vInferencePreCompileConfig": ".seed.vinference",
    "vDriver": ".seed.drivers",
    "vEngine": ".seed.engines",
    "oDriver": ".seed.drivers",
    "oEngine": ".seed.engines",
    "AbstractDriver": ".seed.base_classes",
    "AbstractInferenceEngine": ".seed.base_classes",
    "GenerationState": ".seed.engines",
    "ModelOutputBatch": ".seed.engines",
    "ActiveSequenceBatch": ".seed.engines",
    "PagedAttentionCache": ".kv.paged",
    "HBMPageManager": ".kv.page_manager",
    "ActiveRequest": ".engine.request",
    "ReturnSample": ".engine.request",
    "QueueFullError": ".engine.request",
    "DriverNotReadyError": ".engine.request",
    "ModelLoadError": ".errors",
    "UnsupportedModelError": ".errors",
    "VsurgeError": ".errors",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
del lazy_getattr  # (not a name of the package)


def __dir__():
    return sorted(set(globals()) | set(__all__))
