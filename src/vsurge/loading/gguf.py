"""Load a GGUF file (llama.cpp's format): our reader (gguf_file.py), the `gguf` package's dequantizers.

Tensors keep their GGUF names; each family's GGUF recipes (models/families/<family>.py)
say which of them build which weight, including where llama.cpp's converter
permuted or offset them. Quantized blocks run along each row (HF's input
dimension), so any range of rows (one device's shard of the output dimension,
or some experts of a stacked expert tensor) is dequantized on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import gguf
import numpy as np

from ..errors import ModelLoadError, UnsupportedModelError
from ..models.parts.config_io import GGUFMeta
from ..models.parts.spec import Range
from .gguf_file import GGUFFile

# Types this loader promises; others still load if the `gguf` package can dequantize them.
TESTED_QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")


def open_gguf(path: Path) -> GGUFFile:
    if not path.exists():
        raise ModelLoadError(f"file {str(path)!r} is missing")
    try:
        return GGUFFile(path)
    except Exception as e:  # ValueError/struct.error/UnicodeError/... on garbage
        raise ModelLoadError(f"file {str(path)!r} is not a readable GGUF file: {e}") from None


def field_value(reader: GGUFFile, key: str, default=None):
    value = reader.fields.get(key)
    return default if value is None else value


def dequantize(tensor, index: Sequence[Range | None] = ()) -> np.ndarray:
    """A reader tensor (the index range of each leading axis, or all) -> float32 numpy in HF order.
    The last axis (within quantized rows) is always read whole."""
    kind = tensor.tensor_type
    data = tensor.data
    lead = [slice(None) if r is None else slice(*r) for r in list(index)[: data.ndim - 1]]
    if lead:
        data = data[tuple(lead)]
    if kind == gguf.GGMLQuantizationType.F32:
        return np.array(data, np.float32)
    if kind == gguf.GGMLQuantizationType.F16:
        return np.asarray(data).astype(np.float32)
    try:
        return gguf.quants.dequantize(data, kind).astype(np.float32, copy=False)
    except NotImplementedError:
        raise UnsupportedModelError(
            f"tensor {tensor.name!r} uses quantization type {kind.name}, which cannot be "
            f"dequantized (supported: {', '.join(TESTED_QUANT_TYPES)} and the other types "
            f"of the gguf package)"
        ) from None


def gguf_meta(reader: GGUFFile, path: Path) -> GGUFMeta:
    tensors = {t.name: t for t in reader.tensors}
    shapes = {name: tuple(int(n) for n in reversed(t.shape)) for name, t in tensors.items()}
    return GGUFMeta(reader.fields, shapes, lambda name: dequantize(tensors[name]), f"{str(path)!r}")


class GGUFSource:
    """The tensors of a GGUF file under their GGUF names, in HF orientation, dequantized on demand."""

    def __init__(self, reader: GGUFFile, path: Path, config_tensors: Sequence[str] = ()):
        self.path = path
        self._reader = reader
        # tensors the config was read from are not weights
        self._tensors = {t.name: t for t in reader.tensors if t.name not in set(config_tensors)}

    def names(self) -> set[str]:
        return set(self._tensors)

    def where(self, name: str) -> str:
        t = self._tensors.get(name)
        return f"{str(self.path)!r}" + (f" (GGUF tensor {t.name!r})" if t is not None else "")

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(n) for n in reversed(self._tensors[name].shape))

    def block_type(self, name: str) -> gguf.GGMLQuantizationType | None:
        """The quantized type of a 2-D tensor stored in blocks (None: a float tensor, or not 2-D)."""
        t = self._tensors[name]
        plain = t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16,
                                  gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.F64)
        return None if plain or len(t.shape) != 2 else t.tensor_type

    def raw_rows(self, name: str) -> np.ndarray:
        """A quantized 2-D tensor's blocks as stored: uint8 (N, bytes per row), memory-mapped."""
        return self._tensors[name].data

    def release(self) -> None:
        """The tensors read so far are copied: drop the file's pages from the resident set."""
        self._reader.drop_resident_pages()

    def read(self, name: str, index: Sequence[Range | None] = ()) -> np.ndarray:
        """The index range of each axis (None: all); only those rows are dequantized."""
        t = self._tensors[name]
        index = list(index) + [None] * (len(t.shape) - len(index))
        array = dequantize(t, index)
        last = index[len(t.shape) - 1]
        return array if last is None else array[..., last[0]:last[1]]
