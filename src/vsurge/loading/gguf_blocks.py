"""Weights kept in a GGUF file's block formats instead of dequantized at load.

A weight may stay in blocks when it is declared `quantize` (a (K, N) matrix that linear()
multiplies) or `lookup` (an (N, K) table whose rows are gathered: an embedding, and a tied
output head), is 2-D, and every stored tensor its recipe reads is in a format the kernel
multiplies (ops/quant_layout.py). Its rows are then whole stored rows: quantized blocks run
along each row (the input dimension), so fusing, interleaving, cutting or un-permuting rows
(models/parts/spec.py's recipes) moves whole rows of bytes.

Which stored row becomes which row of the weight is found by running the weight's own recipe
on `_RowIds`, a source whose "values" are row numbers: whatever the recipe does to rows, it
does to the numbers. No recipe kind is special-cased here, and nothing names a weight.
Weights whose rows come in several formats (llama.cpp's Q4_K_M gives attn_v more bits than
attn_q and attn_k) become a QuantizedParts: one block matrix per format and the row order.
"""

from __future__ import annotations

import collections
import logging

import numpy as np

from ..ops.quant_layout import BY_QTYPE
from ..ops.quantized import QuantizedParts, QuantizedWeight, from_gguf

log = logging.getLogger(__name__)


class _NotWholeRows(Exception):
    """The recipe reads part of a row (a column range), or does arithmetic on values."""


class _RowIds:
    """A TensorSource over the given 2-D tensors whose data is each stored row's id
    (the tensor's offset + row number) as an int64 (rows, 1) array."""

    def __init__(self, source, names: list[str]):
        self.source = source
        self.offsets, total = {}, 0
        for name in names:
            self.offsets[name] = total
            total += source.shape(name)[0]

    def names(self):
        return set(self.offsets)

    def shape(self, name):
        return self.source.shape(name)

    def where(self, name):
        return self.source.where(name)

    def read(self, name, index=()):
        n, k = self.source.shape(name)
        index = list(index) + [None] * (2 - len(index))
        rows = index[0] or (0, n)
        if index[1] is not None and tuple(index[1]) != (0, k):
            raise _NotWholeRows(name)
        return (self.offsets[name] + np.arange(*rows, dtype=np.int64))[:, None]


def row_sources(reader, name: str):
    """(stored tensor names, stored row id of each of the weight's N rows (N,)) when weight `name`
    of a WeightReader can be held in blocks; None when it cannot (float tensors, a format the
    kernel lacks, or a recipe that does more than move whole rows)."""
    spec = reader.specs[name]
    if len(spec.shape) != 2 or spec.indexed or not (spec.quantize or spec.lookup):
        return None
    recipe = reader.recipes[name]
    names = list(dict.fromkeys(t for t, _ in recipe.tensors()))
    block_type = getattr(reader.source, "block_type", None)
    if block_type is None or any(block_type(t) not in BY_QTYPE for t in names):
        return None
    n, k = (spec.shape[1], spec.shape[0]) if spec.quantize else spec.shape  # logical (N, K)
    if any(reader.source.shape(t)[1] != k for t in names):
        return None
    try:
        ids = recipe.read(_RowIds(reader.source, names), [(0, s) for s in spec.shape], reader.replicas(name))
    except _NotWholeRows:
        return None
    if ids.dtype.kind != "i":
        return None  # the recipe computed with the values (an offset): they are not rows
    if ids.shape != ((1, n) if spec.quantize else (n, 1)):
        return None
    return names, ids.reshape(n)


def build_blocks(source, names: list[str], ids: np.ndarray) -> QuantizedWeight | QuantizedParts:
    """The weight whose row i is stored row ids[i] (row ids as _RowIds numbers them), in blocks."""
    starts = np.cumsum([0] + [source.shape(t)[0] for t in names])
    which = np.searchsorted(starts, ids, side="right") - 1  # (N,) tensor of each row
    row = ids - starts[which]
    formats = [BY_QTYPE[source.block_type(t)] for t in names]
    by_format = collections.defaultdict(list)  # format -> positions of the weight's rows, in order
    for position, t in enumerate(which):
        by_format[formats[t].name].append(position)
    parts, order, offset = [], np.empty(len(ids), np.int64), 0
    for fmt_name, positions in by_format.items():
        positions = np.asarray(positions)
        first = source.raw_rows(names[which[positions[0]]])
        raw = np.empty((len(positions), first.shape[1]), np.uint8)
        for t in np.unique(which[positions]):
            mask = which[positions] == t
            raw[mask] = source.raw_rows(names[t])[row[positions][mask]]
        parts.append(from_gguf(raw, formats[which[positions[0]]].qtype))
        order[positions] = offset + np.arange(len(positions))
        offset += len(positions)
    if len(parts) == 1:
        return parts[0]
    return QuantizedParts(tuple(parts), tuple(int(i) for i in order))


def keep_blocks(reader) -> dict:
    """Weight name -> QuantizedWeight / QuantizedParts (host-built, device arrays) for every weight of
    a WeightReader that can stay in blocks; logs the choice (a summary at info, each weight at debug)."""
    out, kept, dequantized = {}, collections.Counter(), collections.Counter()
    for name in reader.specs:
        found = row_sources(reader, name)
        spec = reader.specs[name]
        if found is None:
            if len(spec.shape) == 2 and (spec.quantize or spec.lookup):
                kinds = sorted({str(getattr(reader.source, "block_type", lambda _: None)(t) or "float")
                                for t, _ in reader.recipes[name].tensors()})
                dequantized["/".join(kinds)] += 1
                log.debug("%s: dequantized (stored as %s)", name, "/".join(kinds))
            continue
        out[name] = build_blocks(reader.source, *found)
        reader.source.release()  # its rows are copied: the file's pages need not stay resident
        kept[out[name].format] += 1
        log.debug("%s: kept in blocks, %r", name, out[name])
    total = sum(w.nbytes for w in out.values())
    log.info("weights kept in blocks: %d (%s; %.1f MiB)%s", len(out),
             ", ".join(f"{f} {c}" for f, c in sorted(kept.items())), total / 2**20,
             f"; matrices dequantized: {sum(dequantized.values())} "
             f"({', '.join(f'{f} {c}' for f, c in sorted(dequantized.items()))})" if dequantized else "")
    return out
