"""save_inference / load_inference: readable JSON metadata + JAX's persistent compilation cache.

A loaded instance compiles its buckets from the on-disk cache, so it serves
without running the XLA compiler again.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...hardware.compilation_cache import use_compilation_cache
from .inference_config import vInferenceConfig, vInferenceMetaData, vInferencePreCompileConfig

METADATA_FILE = "vinference_metadata.json"
CACHE_DIR = "xla_cache"


def spec_to_json(spec):
    """A PartitionSpec as JSON: one entry per dimension, None, an axis name or a list of names."""
    if spec is None:
        return None
    return [list(entry) if isinstance(entry, tuple) else entry for entry in spec]


def spec_from_json(value):
    """The PartitionSpec `spec_to_json` wrote (or the `str(PartitionSpec(...))` older files hold)."""
    from jax.sharding import PartitionSpec

    if value is None:
        return None
    if isinstance(value, str):  # "P('data', None)" / "PartitionSpec(('data', 'fsdp'),)" (jax's repr)
        import ast

        text = value.strip()
        head = next((h for h in ("PartitionSpec(", "P(") if text.startswith(h)), None)
        if head is None or not text.endswith(")"):
            raise ValueError(f"cannot read input_partition_spec {value!r}")
        inner = text[len(head):-1].strip()
        value = ast.literal_eval(f"({inner.rstrip(',')},)") if inner else ()
    return PartitionSpec(*[tuple(e) if isinstance(e, list) else e for e in value])


def metadata_of(inference) -> vInferenceMetaData:
    return vInferenceMetaData(
        inference_name=inference.inference_name,
        generation_config=inference.generation_config,
        precompiled_configs=dict(inference.precompiled_configs),
        in_compiling_process=set(),
        input_partition_spec=inference.input_partition_spec,
        uuid4=inference.uuid4,
    )


def save_inference(inference, path) -> None:
    path = Path(path)
    use_compilation_cache(path / CACHE_DIR)
    inference._buckets.buckets.clear()  # compile again, now writing every executable to the cache
    for config in inference.precompiled_configs.values():
        for batch, length in config.combinations():
            inference._buckets.get(batch, length)
    meta = metadata_of(inference)
    data = {
        "inference_name": meta.inference_name,
        "generation_config": meta.generation_config.to_json_dict(),
        "precompiled_configs": {str(k): v.model_dump() for k, v in meta.precompiled_configs.items()},
        "input_partition_spec": spec_to_json(meta.input_partition_spec),
        "uuid4": meta.uuid4,
    }
    (path / METADATA_FILE).write_text(json.dumps(data, indent=2))


def load_inference(cls, path, model, processor_class):
    path = Path(path)
    meta_file = path / METADATA_FILE
    if not meta_file.exists():
        raise FileNotFoundError(f"{meta_file} is missing: not a directory written by save_inference")
    data = json.loads(meta_file.read_text())
    use_compilation_cache(path / CACHE_DIR)
    inference = cls(model, processor_class, generation_config=vInferenceConfig.from_json_dict(data["generation_config"]),
                    inference_name=data["inference_name"],
                    input_partition_spec=spec_from_json(data.get("input_partition_spec")))
    inference.uuid4 = data["uuid4"]
    for _, config in sorted(data["precompiled_configs"].items(), key=lambda kv: int(kv[0])):
        inference.precompile(vInferencePreCompileConfig(**config))
    return inference
