"""Load an HF model directory: config.json + single or sharded *.safetensors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import safe_open

from ..config import ModelConfig
from ..errors import ModelLoadError
from ..models.registry import config_from_hf

INDEX_FILE = "model.safetensors.index.json"


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"file {str(path)!r} is missing") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"file {str(path)!r} is not valid JSON: {e}") from None


def load_hf_config(model_dir: Path) -> ModelConfig:
    path = model_dir / "config.json"
    cfg = read_json(path)
    generation = model_dir / "generation_config.json"
    if generation.exists():
        # generation_config's eos list wins: it is what the model was tuned to stop on.
        eos = read_json(generation).get("eos_token_id")
        if eos is not None:
            cfg = {**cfg, "eos_token_id": eos}
    return config_from_hf(cfg, where=str(path))


class SafetensorsSource:
    """Tensors of one or several .safetensors files, read lazily by name."""

    def __init__(self, model_dir: Path):
        self.model_dir = model_dir
        index = model_dir / INDEX_FILE
        self._missing_where = str(index)
        if index.exists():
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ModelLoadError(f"file {str(index)!r} has no 'weight_map'")
            self._file_of = {name: model_dir / f for name, f in weight_map.items()}
        else:
            files = sorted(model_dir.glob("*.safetensors"))
            if not files:
                raise ModelLoadError(
                    f"no weights in {str(model_dir)!r}: expected model.safetensors or {INDEX_FILE}"
                )
            self._file_of = {}
            self._missing_where = ", ".join(str(f) for f in files)
            for f in files:
                with safe_open(f, framework="numpy") as handle:
                    for name in handle.keys():
                        self._file_of[name] = f
        for f in set(self._file_of.values()):
            if not f.exists():
                raise ModelLoadError(f"file {str(f)!r} listed in {INDEX_FILE} is missing")
        self._handles: dict[Path, object] = {}

    def names(self) -> set[str]:
        return set(self._file_of)

    def where(self, name: str) -> str:
        return str(self._file_of.get(name, self._missing_where))

    def get(self, name: str) -> np.ndarray:
        path = self._file_of[name]
        handle = self._handles.get(path)
        if handle is None:
            handle = self._handles[path] = safe_open(path, framework="numpy")
        if handle.get_slice(name).get_dtype() == "BF16":
            # numpy has no bfloat16; read through JAX, which does (ml_dtypes).
            with safe_open(path, framework="flax") as jax_handle:
                return np.asarray(jax_handle.get_tensor(name))
        return handle.get_tensor(name)
