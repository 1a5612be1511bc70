"""Pre-quantized HF checkpoints (AWQ, GPTQ) read as they are: integer weights packed into int32.

Such a checkpoint stores each quantized linear layer `X` as `X.qweight` (the integer codes),
`X.scales` and `X.qzeros` (one scale and zero point per group of `group_size` input weights and
output row), GPTQ adds `X.g_idx` (the group of each input weight), and the config names the
method in `quantization_config`. A weight is w = (code - zero) * scale. The layouts:

- AWQ (AutoAWQ "gemm", llm-awq): qweight int32 (K, N/8): eight 4-bit codes of one input row along
  the output dimension, in the order [0, 2, 4, 6, 1, 3, 5, 7] within each 8 outputs;
  qzeros int32 (K/G, N/8) packed the same way; scales (K/G, N).
- GPTQ (AutoGPTQ, GPTQModel, "gptq" format): qweight int32 (K*b/32, N): 32/b codes of b bits
  along the input dimension, lowest bits first; qzeros int32 (K/G, N*b/32) packed along the
  output dimension; the stored zero is one less than the zero point (format "gptq_v2" stores it
  as it is); scales (K/G, N); g_idx int32 (K,).

`PackedSource` wraps the checkpoint's SafetensorsSource and shows each `X.weight` as the HF
(N, K) matrix the family's recipes expect, so nothing else in the loaders knows the method.
Where the block kernel runs, a 4-bit weight whose groups are runs of 32-weight blocks becomes
GGUF blocks without rounding: Q4_0 when every zero point is 8 (symmetric GPTQ), else Q4_1
(d = scale, m = -zero * scale in float16); an 8-bit symmetric one becomes Q8_0. Other weights
(act-order GPTQ whose groups are not contiguous, 2- and 8-bit asymmetric) are dequantized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import gguf
import numpy as np

from ..errors import ModelLoadError, UnsupportedModelError
from ..models.parts.spec import Range
from ..ops.quant_layout import encode_gguf

METHODS = ("awq", "gptq")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # output column of each nibble within 8 outputs
AWQ_COLUMNS = tuple(AWQ_ORDER.index(c) for c in range(8))  # nibble holding each of 8 output columns
PACKED_PARTS = ("qweight", "qzeros", "scales", "g_idx")
Q = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class PackedScheme:
    method: str  # "awq" or "gptq"
    bits: int
    group_size: int  # input weights per scale; -1: one group per row
    zero_offset: int  # added to the stored zero point (GPTQ's v1 format stores zero - 1)

    @classmethod
    def from_config(cls, cfg: dict, where: str) -> "PackedScheme | None":
        """The scheme of a config.json's `quantization_config`, None where it names none of METHODS."""
        q = cfg.get("quantization_config")
        if not isinstance(q, dict) or str(q.get("quant_method", "")).lower() not in METHODS:
            return None
        method = str(q["quant_method"]).lower()
        bits = int(q.get("bits", q.get("w_bit", 4)))
        group = int(q.get("group_size", q.get("q_group_size", 128)))
        if method == "awq":
            version = str(q.get("version", "gemm")).lower()
            if version != "gemm" or bits != 4 or not q.get("zero_point", True):
                raise UnsupportedModelError(
                    f"{where}: AWQ checkpoints are read in the 'gemm' layout with 4-bit codes and zero points "
                    f"(this one: version {version!r}, {bits} bits, zero_point {q.get('zero_point', True)})")
            return cls("awq", 4, group, 0)
        if bits not in (2, 4, 8):
            raise UnsupportedModelError(f"{where}: GPTQ with {bits}-bit codes is not supported (2, 4 or 8 bits)")
        fmt = str(q.get("checkpoint_format", q.get("format", "gptq"))).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise UnsupportedModelError(f"{where}: GPTQ checkpoint format {fmt!r} is not supported (gptq, gptq_v2)")
        return cls("gptq", bits, group, 1 if fmt == "gptq" else 0)

    def describe(self) -> str:
        return f"{self.method.upper()} {self.bits}-bit, group size {self.group_size}"


def _unpack_codes(packed: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """int32 words -> uint8 codes, 32/bits per word along `axis`, lowest bits first."""
    per = 32 // bits
    words = packed.view(np.uint32)
    shifts = (np.arange(per, dtype=np.uint32) * bits).reshape((-1,) + (1,) * (words.ndim - 1 - axis))
    codes = (np.expand_dims(words, axis + 1) >> shifts) & ((1 << bits) - 1)  # (..., words, per, ...)
    shape = list(words.shape)
    shape[axis] *= per
    return codes.astype(np.uint8).reshape(shape)


class PackedLinear:
    """One quantized linear layer of a checkpoint: its codes, zero points and scales, unpacked."""

    def __init__(self, source, prefix: str, scheme: PackedScheme):
        self.prefix, self.scheme = prefix, scheme
        names = source.names()
        for part in ("qweight", "qzeros", "scales"):
            if f"{prefix}.{part}" not in names:
                raise ModelLoadError(f"tensor {prefix}.{part!s} is missing from {source.where(prefix + '.qweight')} "
                                     f"({scheme.describe()} stores qweight, qzeros and scales per layer)")
        self.source = source
        self.scales = source.read(f"{prefix}.scales").astype(np.float32)  # (groups, N)
        groups, self.n = self.scales.shape
        qweight_shape = source.shape(f"{prefix}.qweight")
        per = 32 // scheme.bits
        self.k = qweight_shape[0] if scheme.method == "awq" else qweight_shape[0] * per
        expected = (self.k, self.n // 8) if scheme.method == "awq" else (self.k // per, self.n)
        if qweight_shape != expected or self.n % per:
            raise ModelLoadError(f"tensor {prefix}.qweight has shape {qweight_shape}; with scales {self.scales.shape} "
                                 f"{scheme.describe()} implies {expected}")
        zeros = _unpack_codes(source.read(f"{prefix}.qzeros"), scheme.bits, axis=1)  # (groups, N)
        if zeros.shape != (groups, self.n):
            raise ModelLoadError(f"tensor {prefix}.qzeros holds {zeros.shape} zero points; scales "
                                 f"{self.scales.shape} need one per scale")
        if scheme.method == "awq":
            zeros = zeros.reshape(groups, -1, 8)[:, :, list(AWQ_COLUMNS)].reshape(groups, -1)
        self.zeros = zeros.astype(np.int32) + scheme.zero_offset  # (groups, N)
        g_idx_name = f"{prefix}.g_idx"
        self.group = scheme.group_size if scheme.group_size > 0 else self.k  # input weights per scale
        default = np.arange(self.k) // self.group
        self.g_idx = source.read(g_idx_name).astype(np.int64) if g_idx_name in names else default
        if self.g_idx.shape != (self.k,) or self.g_idx.min() < 0 or self.g_idx.max() >= groups:
            raise ModelLoadError(f"tensor {g_idx_name} does not give each of the {self.k} inputs one of {groups} groups")
        self.contiguous = bool(np.array_equal(self.g_idx, default)) and groups * self.group == self.k

    def codes(self) -> np.ndarray:
        """uint8 (N, K): the integer codes in HF orientation (output rows)."""
        packed = self.source.read(f"{self.prefix}.qweight")
        if self.scheme.method == "awq":
            codes = _unpack_codes(packed, 4, axis=1)  # (K, N) in nibble order
            codes = codes.reshape(self.k, -1, 8)[:, :, list(AWQ_COLUMNS)].reshape(self.k, self.n)
        else:
            codes = _unpack_codes(packed, self.scheme.bits, axis=0)  # (K, N)
        return np.ascontiguousarray(codes.T)

    def dequantize(self) -> np.ndarray:
        """float32 (N, K): (code - zero) * scale of each weight's group."""
        codes = self.codes().astype(np.float32)
        zeros = self.zeros.T[:, self.g_idx].astype(np.float32)  # (N, K)
        return (codes - zeros) * self.scales.T[:, self.g_idx]

    def block_type(self) -> Q | None:
        """The GGUF block format this layer converts to without rounding its codes, or None."""
        if not self.contiguous or self.group % 32 or self.k % 32:
            return None
        symmetric = bool(np.all(self.zeros == 1 << (self.scheme.bits - 1)))
        if self.scheme.bits == 4:
            return Q.Q4_0 if symmetric else Q.Q4_1
        if self.scheme.bits == 8 and symmetric:
            return Q.Q8_0
        return None

    def gguf_rows(self) -> np.ndarray:
        """uint8 (N, bytes per row): the layer as GGUF blocks of block_type()."""
        qtype = self.block_type()
        per_block = lambda a: np.repeat(a.T, self.group // 32, axis=1)  # noqa: E731  (groups, N) -> (N, K / 32)
        d = per_block(self.scales)
        codes = self.codes()
        if qtype == Q.Q8_0:
            fields = {"codes": (codes.astype(np.int16) - 128).astype(np.int8).view(np.uint8), "d": d}
        elif qtype == Q.Q4_0:
            fields = {"codes": codes, "d": d}
        else:
            fields = {"codes": codes, "d": d, "m": -per_block(self.zeros.astype(np.float32) * self.scales)}
        return encode_gguf(qtype, fields)


class PackedSource:
    """A SafetensorsSource whose AWQ / GPTQ layers read as `X.weight` (N, K): dequantized by `read`,
    or as GGUF blocks by `block_type` / `raw_rows` (loading/gguf_blocks.py keeps those in blocks)."""

    def __init__(self, source, scheme: PackedScheme):
        self.source, self.scheme = source, scheme
        names = source.names()
        self._prefixes = {n[: -len(".qweight")] for n in names if n.endswith(".qweight")}
        if not self._prefixes:
            raise ModelLoadError(f"{source.where('')}: config.json names {scheme.describe()} quantization but no "
                                 "tensor is a packed qweight")
        self._layers: dict[str, PackedLinear] = {}
        self._rows: tuple[str, np.ndarray] | None = None  # the last raw_rows (blocks.py asks per format)

    def _layer(self, name: str) -> PackedLinear | None:
        prefix = name[: -len(".weight")] if name.endswith(".weight") else None
        if prefix not in self._prefixes:
            return None
        if prefix not in self._layers:
            self._layers[prefix] = PackedLinear(self.source, prefix, self.scheme)
        return self._layers[prefix]

    def names(self) -> set[str]:
        packed = {f"{p}.{part}" for p in self._prefixes for part in PACKED_PARTS}
        return (self.source.names() - packed) | {f"{p}.weight" for p in self._prefixes}

    def where(self, name: str) -> str:
        prefix = name[: -len(".weight")] if name.endswith(".weight") else name
        return self.source.where(f"{prefix}.qweight" if prefix in self._prefixes else name)

    def shape(self, name: str) -> tuple[int, ...]:
        layer = self._layer(name)
        return (layer.n, layer.k) if layer else self.source.shape(name)

    def block_type(self, name: str) -> Q | None:
        layer = self._layer(name)
        return layer.block_type() if layer else None

    def raw_rows(self, name: str) -> np.ndarray:
        if self._rows is None or self._rows[0] != name:
            self._rows = (name, self._layer(name).gguf_rows())
        return self._rows[1]

    def release(self) -> None:
        self.source.release()

    def read(self, name: str, index: Sequence[Range | None] = ()) -> np.ndarray:
        layer = self._layer(name)
        if layer is None:
            return self.source.read(name, index)
        w = layer.dequantize()
        return w[tuple(slice(None) if r is None else slice(*r) for r in index)]
