"""Weights kept in GGUF block formats, and the matmul that reads them.

A `QuantizedWeight` is a JAX pytree: one uint8 array of repacked blocks (ops/quant_layout.py)
plus its format and logical shape (N, K) as static metadata, so it passes through jit, scan and
device_put like any array. Formats: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.

`qmatmul(x, w)` computes x (..., K) @ W^T -> (..., N) float32:
- on CPU, where the C++ kernel loaded (vsurge.kernels), as the XLA custom call
  `vsurge_qmatmul`: the weights are read in their bits, and x is quantized per 32-element block
  to int8 with a float32 scale, as llama.cpp quantizes activations (Q8); the integer dot products
  are exact, so the only difference from x @ dequantize(W)^T is x's rounding: on random data the
  relative error of an output is ~0.3-0.5% (tests/ops/test_quant_kernel.py measures it per format);
- elsewhere (GPU, TPU, or a CPU without the kernel): W is dequantized inside the jitted function
  and multiplied with a float dot (x's dtype: float32, or bfloat16 x with bfloat16 weights).
  On a CPU that is slow (~1 s per call for the default model's 135M weights,
  benchmarks/quant_matmul.py --variants xla): there, without the kernel, load dequantized weights.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os

import gguf
import jax
import jax.numpy as jnp
import numpy as np

from vsurge import kernels
from vsurge.ops.quant_layout import (BY_QTYPE, FORMATS, TILE_ROWS, BlockFormat, encode_gguf, repack_gguf, tile_bytes,
                                     tile_count, unpack)

# How many passes the kernel makes over a weight's blocks (QuantizedWeight.passes, set per model at load:
# `activation_passes`). Two: it also multiplies what its int8 rounding of the activations left out (~1/250
# of the rounding error, for twice the integer work; the weights are read once). Below ~1B parameters a
# step is bound by reading the weights, so the second pass is nearly free, and without it the default
# model's greedy answer to "What is the capital of France?" parts from float32's at its first token (a
# 0.08 logit tie the 8-bit activations tip). From ~1B up, prompt steps and batched decode are bound by
# the integer work: one pass, llama.cpp's own arithmetic (its Q8 activations), nearly doubles them.
# The model's passes hold for every row of every step, however many sequences it serves: a request's
# greedy tokens do not depend on the load around it (issue 60; a step of more than four sequences once
# made one pass, and the default model then answered the README's question wrongly under load).
# VSURGE_QMATMUL_PASSES=1 or 2 forces one choice for every model.
FORCED_PASSES = int(os.environ["VSURGE_QMATMUL_PASSES"]) if os.environ.get("VSURGE_QMATMUL_PASSES") else None
ONE_PASS_FROM_HIDDEN = 1024  # models this wide or wider multiply in one pass by default


def activation_passes(config) -> int:
    """The kernel's passes for a model by default: 2 below ONE_PASS_FROM_HIDDEN hidden units, else 1."""
    if FORCED_PASSES is not None:
        return FORCED_PASSES
    return 1 if config.hidden_size >= ONE_PASS_FROM_HIDDEN else 2
QUANTIZABLE = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")  # formats `quantize` makes (gguf's quantizer)

# A step's real tokens (1, N) bool while its forward pass is traced (engine/programs.py `real_rows`):
# the kernel multiplies only those rows of an x with N rows (a step's padding: a 12-token prompt in
# a row of 16, decode rows padded to a bucket) and leaves the others 0. Rows are independent in
# the kernel (each quantized on its own), so the real rows' products are the same bits.
_REAL_ROWS: contextvars.ContextVar = contextvars.ContextVar("vsurge_real_rows", default=None)


@contextlib.contextmanager
def real_rows(mask: jax.Array | None):
    """While tracing a forward pass over tokens (1, N): `mask` (N,) bool marks the real ones (None:
    all). Only an x shaped (1, N, K) is masked: other arrays of N rows are not the token stream."""
    token = _REAL_ROWS.set(None if mask is None else mask[None])
    try:
        yield
    finally:
        _REAL_ROWS.reset(token)


@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    data: jax.Array  # uint8 (tiles, tile bytes): 16 output rows per tile
    format: str  # a key of FORMATS, e.g. "q4_1"
    shape: tuple[int, int]  # logical (N, K): y = x @ W^T
    passes: int = 1  # the kernel's passes over it (a model's: activation_passes, set at load)

    @property
    def block_format(self) -> BlockFormat:
        return FORMATS[self.format]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.data.shape))

    @property
    def sharding(self):
        return getattr(self.data, "sharding", None)

    def __getitem__(self, index):
        """`param[...]` (how nnx reads a Param's value) is the weight itself; nothing else indexes it."""
        if index is Ellipsis:
            return self
        raise TypeError(f"{self!r} cannot be indexed with {index!r}: multiply it with qmatmul or gather_rows")

    def __repr__(self) -> str:
        return f"QuantizedWeight({self.format}, shape={self.shape}, {self.nbytes} bytes)"


jax.tree_util.register_dataclass(QuantizedWeight, data_fields=["data"], meta_fields=["format", "shape", "passes"])


@dataclasses.dataclass(frozen=True)
class QuantizedParts:
    """A weight whose rows are in more than one block format (a fused q/k/v where llama.cpp gave v
    more bits than q and k): one QuantizedWeight per format, and `order` (N,): output row n is row
    order[n] of the parts' outputs concatenated. y = concat(x @ part^T ...)[..., order]."""

    parts: tuple[QuantizedWeight, ...]
    order: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.order), self.parts[0].shape[1]

    @property
    def format(self) -> str:
        return "+".join(p.format for p in self.parts)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def sharding(self):
        return self.parts[0].sharding

    def __getitem__(self, index):
        if index is Ellipsis:
            return self
        raise TypeError(f"{self!r} cannot be indexed with {index!r}")

    def __repr__(self) -> str:
        return f"QuantizedParts({self.format}, shape={self.shape}, {self.nbytes} bytes)"


jax.tree_util.register_dataclass(QuantizedParts, data_fields=["parts"], meta_fields=["order"])


def is_quantized(w) -> bool:
    """A weight held in GGUF blocks (QuantizedWeight or QuantizedParts)."""
    return isinstance(w, (QuantizedWeight, QuantizedParts))


def held_bytes(w) -> int:
    """Bytes a weight holds in memory, whichever way it is held (an array, or blocks)."""
    return sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in jax.tree.leaves(w))


def _format_of(qtype) -> BlockFormat:
    if isinstance(qtype, str):
        fmt = FORMATS.get(qtype.lower())
    else:
        fmt = BY_QTYPE.get(gguf.GGMLQuantizationType(qtype))
    if fmt is None:
        names = ", ".join(FORMATS)
        raise ValueError(f"unsupported quantized format {getattr(qtype, 'name', qtype)!r} (supported: {names})")
    return fmt


def from_gguf(raw: np.ndarray, qtype, shape: tuple[int, int] | None = None) -> QuantizedWeight:
    """GGUF blocks -> QuantizedWeight. raw: uint8 (N, bytes per row), as `gguf.GGUFReader` and
    vsurge.loading.gguf_file give a quantized 2-D tensor; qtype: a gguf.GGMLQuantizationType or a
    format name ("q4_k"); shape: the logical (N, K), checked against raw when given."""
    fmt = _format_of(qtype)
    raw = np.asarray(raw)
    if raw.dtype != np.uint8 or raw.ndim != 2:
        raise ValueError(f"expected GGUF blocks as uint8 (N, bytes per row), got {raw.dtype} {raw.shape}")
    block, size = gguf.GGML_QUANT_SIZES[fmt.qtype]
    if raw.shape[1] % size:
        raise ValueError(f"a {fmt.name} row is a multiple of {size} bytes, got {raw.shape[1]}")
    n, k = raw.shape[0], raw.shape[1] // size * block
    if shape is not None and tuple(shape) != (n, k):
        raise ValueError(f"{fmt.name} blocks {raw.shape} hold a ({n}, {k}) matrix, not {tuple(shape)}")
    tiles = kernels.repack(fmt.kernel_id, raw, n, k, tile_count(n), tile_bytes(fmt, k))  # C++, or None
    return QuantizedWeight(jnp.asarray(tiles if tiles is not None else repack_gguf(raw, fmt)), fmt.name, (n, k))


def quantize(w, format: str = "q8_0", group_size: int = 32) -> QuantizedWeight:
    """Float weights W (N, K) -> QuantizedWeight with gguf's (llama.cpp's reference) quantizer:
    "q8_0" is int8 with one scale per 32 weights, "q4_0" int4 likewise, "q4_1" / "q5_1" add a
    per-block min. K must be a multiple of 32. group_size 64 or 128 (q8_0, q4_0): one scale per
    that many weights, by llama.cpp's rules for those formats, held as blocks of 32 that repeat
    their group's scale (the same bytes as group 32: the blocks keep a scale per 32 weights)."""
    fmt = _format_of(format)
    if fmt.name not in QUANTIZABLE:
        raise ValueError(f"quantize makes {', '.join(QUANTIZABLE)}; {fmt.name} blocks come from a GGUF file")
    w = np.asarray(jax.device_get(w), dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % group_size or group_size % 32:
        raise ValueError(f"expected W (N, K) with K a multiple of the group size {group_size} "
                         f"(itself a multiple of 32), got {w.shape}")
    if group_size == 32:
        return from_gguf(gguf.quants.quantize(w, fmt.qtype), fmt.qtype)
    if fmt.name not in ("q8_0", "q4_0"):
        raise ValueError(f"groups of {group_size} weights are made for q8_0 and q4_0, not {fmt.name}")
    return from_gguf(_quantize_groups(w, fmt, group_size), fmt.qtype)


def _quantize_groups(w: np.ndarray, fmt: BlockFormat, group_size: int) -> np.ndarray:
    """W (N, K) -> GGUF blocks (N, bytes per row) with one scale per `group_size` weights, rounded as
    llama.cpp's quantizer rounds q8_0 (scale absmax / 127) and q4_0 (scale = the signed value of
    largest magnitude / -8, codes floor(x / scale + 8.5) up to 15)."""
    n, k = w.shape
    g = w.reshape(n, k // group_size, group_size)
    if fmt.name == "q8_0":
        d = np.abs(g).max(-1, keepdims=True) / 127
        inv = np.divide(1, d, out=np.zeros_like(d), where=d > 0)
        codes = np.round(g * inv).astype(np.int8).view(np.uint8)
    else:
        extreme = np.take_along_axis(g, np.abs(g).argmax(-1)[..., None], axis=-1)
        d = extreme / -8
        inv = np.divide(1, d, out=np.zeros_like(d), where=d != 0)
        codes = np.minimum(15, np.floor(g * inv + 8.5)).astype(np.uint8)
    d_blocks = np.repeat(d[..., 0], group_size // 32, axis=1)  # (N, K / 32)
    return encode_gguf(fmt.qtype, {"codes": codes.reshape(n, k), "d": d_blocks})


def dequantize(w: QuantizedWeight | QuantizedParts, dtype=jnp.float32) -> jax.Array:
    """W (N, K) in `dtype`; works inside jit on any device."""
    if isinstance(w, QuantizedParts):
        rows = jnp.concatenate([dequantize(p, dtype) for p in w.parts])
        return jnp.take(rows, jnp.asarray(w.order, jnp.int32), axis=0)
    return unpack(w.data, w.block_format, *w.shape, dtype=dtype)


def gather_rows(w: QuantizedWeight, ids: jax.Array, dtype=jnp.float32) -> jax.Array:
    """Rows `ids` (...) int of W (N, K) -> (..., K) in `dtype`: an embedding lookup in a table kept in
    blocks. Each row's 16-row tile is gathered and unpacked (16x the row's arithmetic, a few KB)."""
    n, k = w.shape
    flat = ids.reshape(-1).astype(jnp.int32)
    tiles = jnp.take(w.data, flat // TILE_ROWS, axis=0)  # (M, tile bytes)
    rows = unpack(tiles, w.block_format, tiles.shape[0] * TILE_ROWS, k, dtype=dtype)  # (M * 16, K)
    rows = rows.reshape(-1, TILE_ROWS, k)
    picked = jnp.take_along_axis(rows, (flat % TILE_ROWS)[:, None, None], axis=1)[:, 0]
    return picked.reshape(*ids.shape, k)


def _check(x: jax.Array, w: QuantizedWeight) -> None:
    n, k = w.shape
    if x.shape[-1] != k:
        raise ValueError(f"x (..., {x.shape[-1]}) does not match W {w.shape} (y = x @ W^T)")
    if w.data.shape != (tile_count(n), tile_bytes(w.block_format, k)) or w.data.dtype != jnp.uint8:
        raise ValueError(f"{w!r}: data {w.data.dtype} {w.data.shape} is not its repacked layout")


def _kernel_rows(rows: jax.Array, data: jax.Array, real: jax.Array | None = None, *, fmt: BlockFormat, n: int,
                 passes: int = 1) -> jax.Array:
    """The kernel on rows (M, K). passes 2: it also multiplies what its int8 rounding of each
    32-value block left out, rows - Q8(rows), at 1/256 of the block's scale, in the same pass over
    the weights, the two dot products combined as integers (kernels/qmatmul.h): x @ W^T with x kept
    to ~15 bits instead of 8. real (M,) int32: only the nonzero rows are multiplied, the others come
    out 0."""
    out = jax.ShapeDtypeStruct((rows.shape[0], n), jnp.float32)
    if real is None:
        call = jax.ffi.ffi_call(kernels.FFI_TARGET, out, vmap_method="sequential")
        return call(rows, data, format=np.int64(fmt.kernel_id), passes=np.int64(passes))
    call = jax.ffi.ffi_call(kernels.REAL_ROWS_TARGET, out, vmap_method="sequential")
    return call(rows, data, real.astype(jnp.int32), format=np.int64(fmt.kernel_id), passes=np.int64(passes))


def _fallback_rows(rows: jax.Array, data: jax.Array, *, fmt: BlockFormat, n: int, k: int) -> jax.Array:
    weights = unpack(data, fmt, n, k, dtype=rows.dtype)
    return jax.lax.dot_general(rows, weights, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def with_passes(w, passes: int):
    """A block weight (QuantizedWeight or QuantizedParts) that the kernel multiplies in `passes` passes."""
    if isinstance(w, QuantizedParts):
        return dataclasses.replace(w, parts=tuple(dataclasses.replace(p, passes=passes) for p in w.parts))
    return dataclasses.replace(w, passes=passes)


def qmatmul(x: jax.Array, w: QuantizedWeight | QuantizedParts, *, use_kernel: bool | None = None,
            two_pass: bool | None = None) -> jax.Array:
    """x (..., K) float32 or bfloat16 @ W^T -> (..., N) float32. use_kernel: None = the C++ kernel
    on CPU when it is available, the dequantizing XLA path elsewhere; False = always the XLA path;
    True = the kernel (an error where it is not available). two_pass: the kernel also multiplies
    what its int8 rounding of x left out, in the same call; None: as the weight says
    (its `passes`, the model's choice: activation_passes)."""
    if isinstance(w, QuantizedParts):
        out = jnp.concatenate([qmatmul(x, p, use_kernel=use_kernel, two_pass=two_pass) for p in w.parts], axis=-1)
        return jnp.take(out, jnp.asarray(w.order, jnp.int32), axis=-1)
    _check(x, w)
    n, k = w.shape
    lead = x.shape[:-1]
    rows = x.reshape(-1, k)
    if rows.dtype not in (jnp.float32, jnp.bfloat16):
        rows = rows.astype(jnp.float32)
    fmt = w.block_format
    if use_kernel is None:
        use_kernel = kernels.available()
    elif use_kernel and not kernels.available():
        raise RuntimeError(f"vsurge CPU kernels not available: {kernels.unavailable_reason()}")
    if not use_kernel or rows.shape[0] == 0 or not kernels.tracing_for_cpu():
        out = _fallback_rows(rows, w.data, fmt=fmt, n=n, k=k)
    else:
        two_pass = w.passes == 2 if two_pass is None else two_pass
        passes = 2 if two_pass and k % 32 == 0 else 1
        real = _REAL_ROWS.get()
        if real is not None and real.shape == lead:  # x is the step's token stream (1, N, K)
            real = real.reshape(-1)
        else:  # (any other rows: an expert's tokens, the sampled rows' head)
            real = None
        out = _kernel_rows(rows, w.data, real, fmt=fmt, n=n, passes=passes)
    return out.reshape(*lead, n)
