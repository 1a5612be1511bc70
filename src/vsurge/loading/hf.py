"""Load an HF model directory: config.json + single or sharded *.safetensors.

Tensors are read through a memory map of each file, so reading a slice (one
device's shard of a tensor) touches only the bytes of that slice.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from typing import Sequence

import ml_dtypes
import numpy as np
from safetensors import safe_open

from ..config import ModelConfig
from ..errors import ModelLoadError
from ..models.registry import family_for_hf
from ..models.parts.spec import Range

INDEX_FILE = "model.safetensors.index.json"

# safetensors dtype names -> numpy (bfloat16 through ml_dtypes, which numpy lacks)
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"file {str(path)!r} is missing") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"file {str(path)!r} is not valid JSON: {e}") from None


def read_hf_config(model_dir: Path) -> dict:
    """config.json, with generation_config.json's eos list (what the model was tuned to stop on)."""
    cfg = read_json(model_dir / "config.json")
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"file {str(model_dir / 'config.json')!r} must hold a JSON object")
    generation = model_dir / "generation_config.json"
    if generation.exists():
        eos = read_json(generation).get("eos_token_id")
        if eos is not None:
            cfg = {**cfg, "eos_token_id": eos}
    return cfg


def load_hf_config(model_dir: Path):
    """(family class, ModelConfig) of an HF model directory."""
    where = str(model_dir / "config.json")
    cfg = read_hf_config(model_dir)
    family = family_for_hf(cfg, where)
    config: ModelConfig = family.config_from_hf(cfg, where)
    return family, config


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
        self._maps: dict[Path, tuple[np.memmap, dict, int]] = {}  # file -> (bytes, header, data start)

    def names(self) -> set[str]:
        return set(self._file_of)

    def where(self, name: str) -> str:
        return str(self._file_of.get(name, self._missing_where))

    def _mapped(self, name: str) -> np.ndarray:
        """The tensor as a numpy view of the memory-mapped file (nothing is read yet)."""
        path = self._file_of[name]
        if path not in self._maps:
            with open(path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length))
            self._maps[path] = (np.memmap(path, np.uint8, mode="r"), header, 8 + length)
        data, header, start = self._maps[path]
        info = header[name]
        if info["dtype"] not in _DTYPES:
            raise ModelLoadError(f"tensor {name!r} in {str(path)!r} has dtype {info['dtype']}, which vsurge "
                                 f"cannot read (supported: {', '.join(_DTYPES)})")
        begin, end = info["data_offsets"]
        return data[start + begin:start + end].view(_DTYPES[info["dtype"]]).reshape(info["shape"])

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._mapped(name).shape)

    def release(self) -> None:
        """What was read is copied: drop the mapped files' pages from the resident set (gguf_file.py)."""
        for data, _, _ in self._maps.values():
            data._mmap.madvise(mmap.MADV_DONTNEED)

    def read(self, name: str, index: Sequence[Range | None] = ()) -> np.ndarray:
        """The index range of each axis (None: all), copied out of the file."""
        arr = self._mapped(name)
        return np.array(arr[tuple(slice(None) if r is None else slice(*r) for r in index)])


class RenamedSource:
    """A source whose tensor names have a prefix rewritten ((stored, declared) pairs: a vision-language
    checkpoint's "model.text_model." read where the language family declares "model.")."""

    def __init__(self, source, renames: tuple[tuple[str, str], ...]):
        self.source = source
        self._stored: dict[str, str] = {}
        for name in source.names():
            new = next((to + name[len(old):] for old, to in renames if name.startswith(old)), name)
            self._stored[new] = name

    def names(self) -> set[str]:
        return set(self._stored)

    def where(self, name: str) -> str:
        return self.source.where(self._stored.get(name, name))

    def shape(self, name: str) -> tuple[int, ...]:
        return self.source.shape(self._stored[name])

    def read(self, name: str, index=()) -> np.ndarray:
        return self.source.read(self._stored[name], index)

    def release(self) -> None:
        self.source.release()
