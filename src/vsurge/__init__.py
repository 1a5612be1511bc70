"""vsurge: run and serve Llama-family language models with JAX.

Names are imported on first use (PEP 562), so `import vsurge` is instant and the
pure-Python parts (scheduler, page manager, CLI argument parsing) never load JAX.
"""

from importlib import import_module

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
    "vSurge": ".vsurge",
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


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vsurge' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
