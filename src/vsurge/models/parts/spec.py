"""A family's weights, declared: shape, logical axes and where each comes from in a checkpoint.

Every model weight is a `Weight`: its shape in the model's layout, the logical
name of each axis (hardware/sharding.py maps names onto mesh axes), whether int8
quantization may replace it, and one `Recipe` per checkpoint format (HF
safetensors, GGUF) saying which stored tensors build it and how. Loaders,
sharding and quantization read these declarations and never name a weight.

A recipe builds any contiguous slice of its weight from only the stored rows
that slice needs (`read(source, spans)`), so a device can load just its shard
of a model larger than its memory. Stored tensors come from a `TensorSource`:
HF orientation (out, in), float numpy, whole or an index range per axis.

Recipes:
    Tensor      one stored tensor, optionally transposed to (in, out), one row range of
                it (a part of a fused tensor), shifted by a constant (Gemma's 1 + w
                norms), or with rows un-permuted from an interleaved rotary layout
    FusedQKV    q, k, v fused into one (D, KV groups) matrix or bias (models/parts/fused.py)
    GateUp      gate and up interleaved along the last axis (models/parts/fused.py)
    Stack       one weight per expert stacked on a leading axis
    HeadSlice   a per-head row range of a stored (H * rows, in) matrix, as (H, rows, in)
    HeadRows    the same rows of every head, as one (in, H * rows) matrix (Qwen3-Next's query and
                output gate, interleaved per head in one projection)
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Protocol, Sequence

import numpy as np

from .fused import fuse_qkv_rows, interleave_gate_up_rows

Range = tuple[int, int]  # [start, stop)


class TensorSource(Protocol):
    """The tensors of one checkpoint, by stored name (safetensors, GGUF)."""

    def names(self) -> set[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def read(self, name: str, index: Sequence[Range | None] = ()) -> np.ndarray:
        """The tensor (HF orientation), or the index range of each leading axis (None = all)."""
        ...

    def where(self, name: str) -> str:
        """The file a tensor lives in, for error messages."""
        ...

    def release(self) -> None:
        """Everything read so far has been copied out: let the file's mapped pages leave the
        process's resident memory (they are read again if needed)."""
        ...


class Recipe(Protocol):
    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """(stored name, stored shape) of every tensor this recipe reads."""
        ...

    def read(self, source: TensorSource, spans: list[Range], kv_replicas: int = 1) -> np.ndarray:
        """The weight's slice `spans` (one [start, stop) per model axis), in model layout."""
        ...


def _cut(array: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    index = [slice(None)] * array.ndim
    index[axis] = slice(start, stop)
    return array[tuple(index)]


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One stored tensor. `shape` is as stored; the model sees it with the last two axes swapped
    when `transpose` (HF (out, in) -> (in, out)). `rows` takes only that range of the stored
    output axis (axis 0 of a vector, -2 of a matrix). `permuted_heads` > 0: that axis holds
    this many heads whose rotary rows (`permute_span` of each head; None = all of it) are stored
    as interleaved pairs (llama.cpp's converter, DeepSeek's checkpoints); they are put back in
    the rotate-half order the model computes with."""

    name: str
    shape: tuple[int, ...]
    transpose: bool = False
    rows: Range | None = None
    offset: float = 0.0
    permuted_heads: int = 0
    permute_span: Range | None = None

    @property
    def out_axis(self) -> int:
        return 0 if len(self.shape) == 1 else len(self.shape) - 2

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The shape this recipe yields before any transpose (rows cut)."""
        if self.rows is None:
            return self.shape
        shape = list(self.shape)
        shape[self.out_axis] = self.rows[1] - self.rows[0]
        return tuple(shape)

    @property
    def model_shape(self) -> tuple[int, ...]:
        s = self.stored_shape
        return (*s[:-2], s[-1], s[-2]) if self.transpose else s

    def tensors(self):
        return [(self.name, self.shape)]

    def read(self, source: TensorSource, spans: list[Range], kv_replicas: int = 1) -> np.ndarray:
        spans = list(spans)
        if self.transpose:
            spans[-1], spans[-2] = spans[-2], spans[-1]
        axis = self.out_axis
        base = 0 if self.rows is None else self.rows[0]
        start, stop = spans[axis][0] + base, spans[axis][1] + base
        if self.permuted_heads:  # whole heads: the permutation moves rows within a head
            size = self.shape[axis] // self.permuted_heads
            first, last = start // size, -(-stop // size)
            index = list(spans)
            index[axis] = (first * size, last * size)
            array = _unpermute(source.read(self.name, index), axis, last - first, self.permute_span)
            array = _cut(array, axis, start - first * size, stop - first * size)
        else:
            index = list(spans)
            index[axis] = (start, stop)
            array = source.read(self.name, index)
        if self.offset:
            array = array.astype(np.float32) + np.float32(self.offset)
        return np.swapaxes(array, -1, -2) if self.transpose else array


def _unpermute(w: np.ndarray, axis: int, heads: int, span: Range | None) -> np.ndarray:
    """Rows of `heads` heads along `axis`, rows `span` of each head (all when None) stored as
    interleaved pairs (x0, y0, x1, y1, ...) -> rotate-half order (x0, x1, ..., y0, y1, ...)."""
    w = np.moveaxis(w, axis, 0)
    per_head = w.shape[0] // heads
    a, b = span or (0, per_head)
    rest = w.shape[1:]
    view = w.reshape(heads, per_head, *rest)
    rotary = view[:, a:b].reshape(heads, (b - a) // 2, 2, *rest).swapaxes(1, 2).reshape(heads, b - a, *rest)
    out = np.concatenate([view[:, :a], rotary, view[:, b:]], axis=1)
    return np.moveaxis(out.reshape(w.shape), 0, axis)


@dataclasses.dataclass(frozen=True)
class FusedQKV:
    """q, k, v parts (stored (rows, D) matrices or (rows,) biases) -> the fused layout of
    models/parts/fused.py: (D, KVH * (G + 2) * hd) or (KVH * (G + 2) * hd,). Under tensor parallelism
    with replicated KV heads (`kv_replicas` > 1), each KV head is copied to its groups."""

    q: Tensor
    k: Tensor
    v: Tensor
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def tensors(self):
        return [t for part in (self.q, self.k, self.v) for t in part.tensors()]

    def replicas_for(self, width: int) -> int:
        """The KV-head copies a fused width implies: (H + 2 * KVH * r) * hd = width."""
        return (width // self.head_dim - self.num_heads) // (2 * self.num_kv_heads)

    def read(self, source: TensorSource, spans: list[Range], kv_replicas: int = 1) -> np.ndarray:
        hd, r = self.head_dim, kv_replicas
        groups = self.num_kv_heads * r
        g = self.num_heads // groups  # query heads per group
        width = (g + 2) * hd
        start, stop = spans[-1]
        g0, g1 = start // width, -(-stop // width)
        lead = [s for s in spans[:-1]]  # (D,) range of a matrix; none for a bias

        def rows(part: Tensor, first: int, last: int) -> np.ndarray:  # stored orientation (rows, ...)
            out = part.read(source, lead + [(first, last)] if part.transpose else [(first, last)])
            return np.swapaxes(out, -1, -2) if part.transpose else out

        q = rows(self.q, g0 * g * hd, g1 * g * hd)
        kv_rows = ((g0 // r) * hd, ((g1 - 1) // r + 1) * hd)
        k, v = rows(self.k, *kv_rows), rows(self.v, *kv_rows)
        fused = fuse_qkv_rows(q, k, v, _Heads(self.num_heads, self.num_kv_heads, hd), first_group=g0,
                              kv_replicas=r)
        fused = fused[start - g0 * width:stop - g0 * width]
        return fused.T if fused.ndim == 2 else fused


@dataclasses.dataclass(frozen=True)
class _Heads:
    """The head counts fuse_qkv_rows reads from a config."""

    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclasses.dataclass(frozen=True)
class GateUp:
    """gate and up (each a recipe of model shape (..., F)) interleaved -> (..., 2F)."""

    gate: Recipe
    up: Recipe

    def tensors(self):
        return self.gate.tensors() + self.up.tensors()

    def read(self, source: TensorSource, spans: list[Range], kv_replicas: int = 1) -> np.ndarray:
        start, stop = spans[-1]
        f0, f1 = start // 2, -(-stop // 2)
        part = list(spans[:-1]) + [(f0, f1)]
        gate, up = self.gate.read(source, part), self.up.read(source, part)
        pairs = np.moveaxis(interleave_gate_up_rows(np.moveaxis(gate, -1, 0), np.moveaxis(up, -1, 0)), 0, -1)
        return pairs[..., start - 2 * f0:stop - 2 * f0]


@dataclasses.dataclass(frozen=True)
class Stack:
    """One recipe per expert -> (E, ...)."""

    items: tuple

    def tensors(self):
        return [t for item in self.items for t in item.tensors()]

    def read(self, source: TensorSource, spans: list[Range], kv_replicas: int = 1) -> np.ndarray:
        start, stop = spans[0]
        return np.stack([self.items[e].read(source, list(spans[1:])) for e in range(start, stop)])


@dataclasses.dataclass(frozen=True)
class Columns:
    """Columns [part) of the last axis of a stored tensor, read as stored (no transpose): one half of a
    fused (E, D, 2F) gate/up stack stored gate then up (Llama 4, Qwen3-VL-MoE)."""

    name: str
    shape: tuple[int, ...]
    part: Range

    def tensors(self):
        return [(self.name, self.shape)]

    def read(self, source: TensorSource, spans: list[Range], kv_replicas: int = 1) -> np.ndarray:
        first = self.part[0]
        return source.read(self.name, [*spans[:-1], (first + spans[-1][0], first + spans[-1][1])])


@dataclasses.dataclass(frozen=True)
class Joined:
    """Recipes of one model shape stacked along a new `axis`: a tensor a converter stored in pieces
    (llama.cpp splits Qwen-VL's Conv3d patch kernel (D, C, frames, p, p) into one (D, C, p, p) per frame)."""

    items: tuple
    axis: int

    def tensors(self):
        return [t for item in self.items for t in item.tensors()]

    def read(self, source: TensorSource, spans: list[Range], kv_replicas: int = 1) -> np.ndarray:
        start, stop = spans[self.axis]
        inner = [s for k, s in enumerate(spans) if k != self.axis]
        return np.stack([self.items[j].read(source, inner) for j in range(start, stop)], axis=self.axis)


@dataclasses.dataclass(frozen=True)
class HeadSlice:
    """Rows [part) of every head of a stored (H * per_head, in) matrix -> (H, rows, in), or
    (H, in, rows) with `transpose`."""

    name: str
    shape: tuple[int, int]
    heads: int
    part: Range
    transpose: bool = False

    def tensors(self):
        return [(self.name, self.shape)]

    def read(self, source: TensorSource, spans: list[Range], kv_replicas: int = 1) -> np.ndarray:
        per_head = self.shape[0] // self.heads
        h0, h1 = spans[0]
        block = source.read(self.name, [(h0 * per_head, h1 * per_head)])
        block = block.reshape(h1 - h0, per_head, self.shape[1])[:, self.part[0]:self.part[1]]
        if self.transpose:
            block = block.swapaxes(1, 2)
        return block[:, spans[1][0]:spans[1][1], spans[2][0]:spans[2][1]]


@dataclasses.dataclass(frozen=True)
class HeadRows:
    """Rows [part) of every head of a stored (H * per_head, in) matrix -> (in, H * rows): what a
    `tensor` of only those rows would give."""

    name: str
    shape: tuple[int, int]
    heads: int
    part: Range

    def tensors(self):
        return [(self.name, self.shape)]

    def read(self, source: TensorSource, spans: list[Range], kv_replicas: int = 1) -> np.ndarray:
        per_head = self.shape[0] // self.heads
        stored = source.read(self.name)  # (H * per_head, in); in = 1 for the block loader's row ids
        block = stored.reshape(self.heads, per_head, -1)[:, self.part[0]:self.part[1]]
        out = block.reshape(-1, stored.shape[-1]).T  # (in, H * rows)
        return out[spans[0][0]:spans[0][1], spans[1][0]:spans[1][1]]


@dataclasses.dataclass(frozen=True)
class Mapped:
    """A recipe whose whole tensor goes through `fn` (values or shape) before the slice is cut:
    for the small tensors llama.cpp's converter stores transformed (Qwen3-Next's A = -exp(A_log),
    short convolutions squeezed to (C, K)), which are replicated and read whole."""

    recipe: Recipe
    shape: tuple[int, ...]
    fn: Callable[[np.ndarray], np.ndarray]

    def tensors(self):
        return self.recipe.tensors()

    def read(self, source, spans, kv_replicas: int = 1):
        stored = self.recipe.model_shape
        whole = self.fn(self.recipe.read(source, [(0, n) for n in stored])).reshape(self.shape)
        return whole[tuple(slice(a, b) for a, b in spans)]


@dataclasses.dataclass(frozen=True)
class Weight:
    """One model weight: shape and logical axes in the model's layout, and its recipes.

    init: how a randomly initialized model fills it ("normal", "ones", "zeros").
    quantize: a (..., K, N) matrix contracted over K that int8 weight-only quantization may
        replace (its scale takes the last axis).
    kv_groups: its last axis is fused qkv groups (models/parts/fused.py): replicated with the KV
        heads when the tensor-parallel size needs more KV heads than the checkpoint has.
    indexed: read one slice at a time by a dynamic index inside a loop (stacked experts). Where its
        dtype is narrower than the activations' (bfloat16 on CPU) it is held as its raw bits:
        XLA:CPU would otherwise convert the whole stack to float32 outside the loop.
    lookup: an (N, K) table whose rows are looked up (an embedding, also a tied output head):
        a GGUF file's blocks may hold it as they are (loading/gguf_blocks.py), rows gathered and
        dequantized as they are read, and the head multiplied by the block kernel."""

    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    hf: Recipe | None = None
    gguf: Recipe | None = None
    init: str = "normal"
    quantize: bool = False
    kv_groups: bool = False
    indexed: bool = False
    lookup: bool = False

    def __post_init__(self):
        if len(self.shape) != len(self.axes):
            raise ValueError(f"weight of shape {self.shape} has {len(self.axes)} axis names")


def tensor(name: str, shape: tuple[int, ...], *, matrix: bool = True, **kw) -> Tensor:
    """A stored tensor of HF orientation: matrices (out, in) are transposed to (in, out)."""
    return Tensor(name, tuple(shape), transpose=matrix and len(shape) >= 2, **kw)


def paired(hf: str, gguf: str | None, shape: tuple[int, ...], **kw) -> tuple[Tensor, Tensor | None]:
    """The `hf` and `gguf` recipes (as Weight takes them) of one tensor that both formats store alike."""
    return tensor(hf, shape, **kw), gguf and tensor(gguf, shape, **kw)


FP4_E2M1 = np.asarray([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      np.float32)


@dataclasses.dataclass(frozen=True)
class MXFP4:
    """Experts stored as OCP MXFP4 (GPT-OSS checkpoints): `blocks` (E, R, G, 16) bytes of two
    e2m1 values each (low nibble first) and `scales` (E, R, G) e8m0 exponents of each 32-value
    group, R output rows of G * 32 inputs. Dequantized at load to the model's (E, in, R)."""

    blocks: str
    scales: str
    experts: int
    rows: int
    inputs: int

    def tensors(self):
        g = self.inputs // 32
        return [(self.blocks, (self.experts, self.rows, g, 16)), (self.scales, (self.experts, self.rows, g))]

    def read(self, source: TensorSource, spans: list[Range], kv_replicas: int = 1) -> np.ndarray:
        e0, e1 = spans[0]
        blocks = source.read(self.blocks, [(e0, e1)]).astype(np.uint8)  # (e, R, G, 16)
        scales = source.read(self.scales, [(e0, e1)]).astype(np.int32) - 127  # (e, R, G)
        values = np.empty((*blocks.shape[:-1], 32), np.float32)
        values[..., 0::2] = FP4_E2M1[blocks & 0x0F]
        values[..., 1::2] = FP4_E2M1[blocks >> 4]
        values = np.ldexp(values, scales[..., None]).reshape(e1 - e0, self.rows, self.inputs)
        out = values.transpose(0, 2, 1)  # (e, in, R)
        return out[:, spans[1][0]:spans[1][1], spans[2][0]:spans[2][1]]
