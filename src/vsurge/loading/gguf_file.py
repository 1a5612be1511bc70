"""A GGUF file's metadata and tensor table, read in one pass over a memory map.

The `gguf` package's GGUFReader builds a numpy view per metadata item: on a
model with a 49k-token vocabulary (two string arrays of ~49k items each) that
takes ~2.4 s, paid at every start of `vsurge serve`. This reader walks the same
layout with `struct` (~0.1 s) and gives the tensors as the same memory-mapped
views GGUFReader gives (quantized types as rows of raw bytes), so `gguf`'s
dequantizers still do the arithmetic. Layout (little-endian, version 2 and 3):

    "GGUF" u32 version, u64 tensor count, u64 metadata count
    metadata:  string key, u32 value type, value (arrays: u32 item type, u64 count, items)
    tensors:   string name, u32 dims, u64 * dims (innermost first), u32 type, u64 offset
    data:      from the next multiple of general.alignment (default 32)
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
# value type -> struct format of one scalar
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
# tensor types numpy reads directly; every other type is rows of raw bytes (as GGUFReader gives them)
PLAIN_TENSOR_TYPES = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
                      GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
                      GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
                      GGMLQuantizationType.I64: np.int64}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order: innermost (contiguous) dimension first
    data: np.ndarray  # memory-mapped; numpy order (reversed shape), quantized types as (..., bytes per row) u8


class GGUFFile:
    """`fields`: metadata key -> Python value (str, int, float, bool, or a list of them);
    `tensors`: GGUFTensor in file order. Raises ValueError on a file that is not GGUF."""

    def __init__(self, path: str | Path):
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._pos = 0
        if self._read(4) != MAGIC:
            raise ValueError("no GGUF magic number at the start")
        version = self._scalar("I")
        if version not in (2, 3) and int.from_bytes(version.to_bytes(4, "little"), "big") in (2, 3):
            raise ValueError("big-endian GGUF files are not supported (convert the file on a little-endian machine)")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
        tensor_count, field_count = self._scalar("Q"), self._scalar("Q")
        self.fields: dict[str, object] = {}
        for _ in range(field_count):
            key = self._string()
            self.fields[key] = self._value(self._scalar("I"))
        infos = [self._tensor_info() for _ in range(tensor_count)]
        alignment = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-self._pos // alignment) * alignment
        self.tensors = [self._tensor(start, *info) for info in infos]

    def drop_resident_pages(self) -> None:
        """Take the file's pages out of this process's resident set (they stay in the page cache;
        a later read faults them back in). Loading copies every tensor into its own arrays, and
        without this the mapped file counted in the peak beside those copies (a 1.2 GiB file's
        load peaked at 2.7 GiB)."""
        self._map.madvise(mmap.MADV_DONTNEED)

    # ------------------------------------------------------------ the layout
    def _read(self, n: int) -> bytes:
        if self._pos + n > len(self._map):
            raise ValueError(f"the file ends inside an item at byte {self._pos}")
        out = self._map[self._pos:self._pos + n]
        self._pos += n
        return out

    def _scalar(self, fmt: str):
        return struct.unpack("<" + fmt, self._read(struct.calcsize(fmt)))[0]

    def _string(self) -> str:
        return self._read(self._scalar("Q")).decode("utf-8", errors="replace")

    def _value(self, kind: int):
        if kind == STRING:
            return self._string()
        if kind == ARRAY:
            item, count = self._scalar("I"), self._scalar("Q")
            if item == STRING:
                return self._strings(count)
            if item not in SCALARS:
                return [self._value(item) for _ in range(count)]
            fmt = SCALARS[item]
            return list(struct.unpack(f"<{count}{fmt}", self._read(count * struct.calcsize(fmt))))
        if kind not in SCALARS:
            raise ValueError(f"unknown GGUF value type {kind} at byte {self._pos}")
        return self._scalar(SCALARS[kind])

    def _strings(self, count: int) -> list[str]:
        """`count` strings (the hot loop: vocabularies and merges hold tens of thousands)."""
        buf, pos, unpack, out = self._map, self._pos, struct.unpack_from, []
        for _ in range(count):
            (n,) = unpack("<Q", buf, pos)
            out.append(buf[pos + 8:pos + 8 + n].decode("utf-8", errors="replace"))
            pos += 8 + n
        if pos > len(buf):
            raise ValueError("the file ends inside a string array")
        self._pos = pos
        return out

    def _tensor_info(self):
        name = self._string()
        dims = tuple(self._scalar("Q") for _ in range(self._scalar("I")))
        return name, GGMLQuantizationType(self._scalar("I")), dims, self._scalar("Q")

    def _tensor(self, start: int, name: str, kind: GGMLQuantizationType, dims: tuple[int, ...], offset: int):
        shape = tuple(reversed(dims))  # numpy order
        count = int(np.prod(dims, dtype=np.int64))
        if kind in PLAIN_TENSOR_TYPES:
            dtype, items = np.dtype(PLAIN_TENSOR_TYPES[kind]), count
        else:
            block, size = GGML_QUANT_SIZES[kind]
            dtype, items, shape = np.dtype(np.uint8), count * size // block, quant_shape_to_byte_shape(shape, kind)
        if start + offset + items * dtype.itemsize > len(self._map):
            raise ValueError(f"tensor {name!r} runs past the end of the file")
        data = np.frombuffer(self._map, dtype, items, start + offset).reshape(shape)
        return GGUFTensor(name, kind, dims, data)
