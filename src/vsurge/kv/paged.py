"""Paged KV cache: fixed-size pages shared by every sequence, found through page tables.

One engine step runs a packed row of N tokens: first D decode tokens (one per decoding sequence), then
P chunk rows of C prefill tokens each (`StepLayout`). The pages' layout, each token's K/V write into its
page slot (`slot_mapping`) and attention belong to the cache's attention backend (kv/backends: the
column layout of the CPU, keys (P, KVH, hd, ps) and values (P, KVH, ps, hd), or the TPU kernel's).
Every backend writes a step's K/V before attending, so a chunk row sees the keys of earlier chunk rows
of the same sequence written in the same step. Stored as int8 / fp8 (`--kv-cache-dtype`), each token's
K/V per head is quantized at the scatter and each gathered page expanded before attention (kv/quant.py).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from ..config import AttentionSpec, KVLayer, StateLayer
from .. import kernels as cpp_kernels
from . import cpu_attention, quant
from .backends import get as get_backend
from .recurrent import init_states, replace_part, run_packed


def page_bytes(layout: tuple[KVLayer, ...], page_size: int, dtype, held=lambda layer, dtype: layer.heads) -> int:
    """Bytes one page takes over all layers, keys and values (layout: `config.kv_layout`; dtype: the
    pages' storage dtype, int8 = quantized with its scales, kv/quant.py; held: the KV heads a backend's pool
    holds per layer, kv/backends: the tpu layout pads some counts)."""
    per_token = sum(held(l, dtype) * (quant.token_bytes(l.k_dim, dtype) + quant.token_bytes(l.v_dim, dtype))
                    for l in layout)
    return page_size * per_token


def pool_dtype(model, config):
    """The storage dtype of an engine's pages (`config.kv_cache_dtype`): "auto" is the model's
    activation dtype, except on a CPU whose C++ kernels read and write 16-bit pages (kv/access.py,
    kv/cpu_attention.py), where float32 activations get float16 pages: half the memory at about the
    same speed (benchmarks/serve.py), llama.cpp's default cache type."""
    if config.kv_cache_dtype in (None, "auto") and half_pages_on_cpu(model):
        return jnp.dtype(jnp.float16)
    return quant.storage_dtype(config.kv_cache_dtype, model.dtype)


def half_pages_on_cpu(model) -> bool:
    from ..hardware.sharding import mesh_of

    mesh = mesh_of(model)
    return (jax.default_backend() == "cpu" and jnp.dtype(model.dtype) == jnp.float32 and cpu_attention.ENABLED
            and cpp_kernels.available() and (mesh is None or mesh.size == 1))


def pool_page_bytes(model, config) -> int:
    """Bytes of one page of an engine's pool (`config`: its EngineConfig) over every layer."""
    from .backends import resolve

    backend = get_backend(resolve(config.attention_backend))
    return page_bytes(model.config.kv_layout, config.page_size, pool_dtype(model, config), backend.held_heads)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class StepLayout:
    """Where one step's tokens go and what each row attends to (set by the engine per step)."""

    slot_mapping: jax.Array  # (N,) page * page_size + offset; num_pages * page_size = not written
    decode_tables: jax.Array  # (D, Wd) page ids of each decode row
    decode_pos: jax.Array  # (D, 1) position of each decode token (-1 = padding row)
    chunk_tables: jax.Array  # (P, Wc) page ids of each chunk row
    chunk_pos: jax.Array  # (P, C) positions of each chunk token (-1 = padding)
    num_columns: jax.Array | None = None  # () i32: read only this many page columns (None = all)
    # sequence slot of each row, whose recurrent states the row reads and writes (kv/recurrent.py)
    decode_slots: jax.Array | None = None  # (D,) i32
    chunk_slots: jax.Array | None = None  # (P,) i32
    # snapshot row each chunk row resumes from / leaves its end states in (-1: none; kv/state_snapshots.py)
    chunk_restore: jax.Array | None = None  # (P,) i32
    chunk_save: jax.Array | None = None  # (P,) i32
    # speculation on a hybrid model (kv/recurrent.py run_packed): a decode row may start from a row of
    # the draft states (the state after the drafts its sequence's last step accepted; -1: its slot's)
    decode_restore: jax.Array | None = None  # (D,) i32
    # the step's X draft rows, run after the decode rows, one after another: the row each is (-1 = none),
    # its sequence's slot, the draft-state row it starts from (-1: the slot's) and the one it writes
    draft_rows: jax.Array | None = None  # (X,) i32
    draft_slots: jax.Array | None = None  # (X,) i32
    draft_from: jax.Array | None = None  # (X,) i32
    draft_to: jax.Array | None = None  # (X,) i32
    # the last key position each chunk token sees where that is not its own (a model whose image tokens
    # attend to their whole image, Gemma 3: the image's last position); None: causal
    chunk_limit: jax.Array | None = None  # (P, C) i32

    @property
    def num_decode(self) -> int:
        return self.decode_tables.shape[0]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PagedAttentionCache:
    # logical axes (hardware/sharding.py): pages are shared by every sequence, KV heads split over `model`
    K_AXES: ClassVar[tuple[str, ...]] = ("pages", "kv_heads", "head_dim", "page_offset")
    V_AXES: ClassVar[tuple[str, ...]] = ("pages", "kv_heads", "page_offset", "head_dim")

    k: list  # per attention layer (num_pages, KVH, dk, page_size)
    v: list  # per attention layer (num_pages, KVH, page_size, dv)
    # per recurrent layer {part: (S+1, ...) f32}, one row per sequence slot (kv/recurrent.py)
    states: list = dataclasses.field(default_factory=list)
    # per recurrent layer {part: (R+1, ...) f32}: states at page boundaries of prompts, for the prefix
    # cache (kv/state_snapshots.py; the last row the spare); empty without snapshots
    snapshots: list = dataclasses.field(default_factory=list)
    # per recurrent layer {part: (X+1, ...) f32}: states after each draft of the last step that speculated
    # (kv/recurrent.py; the last row the spare); empty unless a hybrid model's engine speculates
    drafts: list = dataclasses.field(default_factory=list)
    layout: StepLayout | None = None  # per step; None between steps
    # the pool's shape (static: a model without attention layers, plain Mamba-2, has no k/v pages)
    pages: int = dataclasses.field(default=0, metadata=dict(static=True))
    size: int = dataclasses.field(default=0, metadata=dict(static=True))
    # the attention backend that owns the pages' layout, their writes and attention (kv/backends)
    backend: str = dataclasses.field(default="cpu", metadata=dict(static=True))

    @classmethod
    def init(cls, layers: tuple[KVLayer, ...], num_pages: int, page_size: int, dtype=jnp.float32,
             state_layout: tuple[StateLayer, ...] = (), state_rows: int = 0, snapshot_rows: int = 0,
             draft_rows: int = 0, state_dtype=jnp.float32, backend: str = "cpu"):
        """layers: the model's per-layer KV shapes (`config.kv_layout`); dtype: the storage dtype
        (int8: quantized, head_dim + 2 with the scales, kv/quant.py); state_layout: its recurrent
        layers' states (`config.state_layout`), `state_rows` of each (the slots and the spare), and
        `snapshot_rows` (+ a spare) of each for the prefix cache, `draft_rows` (+ a spare) for speculation,
        stored as `state_dtype` (kv/recurrent.py state_dtype); backend: a resolved kv/backends name, whose
        layout the pages take."""
        k, v = get_backend(backend).init_pools(layers, num_pages, page_size, dtype)
        return cls(k=k, v=v, states=init_states(state_layout, state_rows, state_dtype),
                   snapshots=init_states(state_layout, snapshot_rows + 1, state_dtype) if snapshot_rows else [],
                   drafts=init_states(state_layout, draft_rows + 1, state_dtype) if draft_rows else [],
                   pages=num_pages, size=page_size, backend=backend)

    def layer_axes(self, layer: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The logical axes (hardware/sharding.py) of one attention layer's key and value pools, in the layout
        of the pages' backend (the tpu backend's differ by layer)."""
        return get_backend(self.backend).pool_axes(self.k[layer], self.v[layer])

    @property
    def num_pages(self) -> int:
        return self.pages

    @property
    def page_size(self) -> int:
        return self.size

    def for_step(self, layout: StepLayout) -> "PagedAttentionCache":
        return dataclasses.replace(self, layout=layout)

    def storage_only(self) -> "PagedAttentionCache":
        return dataclasses.replace(self, layout=None)

    def recurrent(self, index, part, op, inputs, positions, shape):
        """inputs (1, N, ...): each row's state read from and written back to its slot."""
        snaps = self.snapshots[index][part] if self.snapshots else None
        drafts = self.drafts[index][part] if self.drafts else None
        out, new, snaps, drafts = run_packed(op, inputs, self.states[index][part], self.layout, snaps, drafts)
        cache = dataclasses.replace(self, states=replace_part(self.states, index, part, new))
        if snaps is not None:
            cache = dataclasses.replace(cache, snapshots=replace_part(self.snapshots, index, part, snaps))
        if drafts is not None:
            cache = dataclasses.replace(cache, drafts=replace_part(self.drafts, index, part, drafts))
        return out, cache

    def attend(self, layer, q, k, v, positions, spec: AttentionSpec, sinks=None):
        """q (1, N, H, dk), k (1, N, KVH, dk), v (1, N, KVH, dv): D decode tokens, then P chunk rows
        of C tokens; each written into its page slot, then attended by this cache's backend (kv/backends)."""
        return get_backend(self.backend).attend(self, layer, q, k, v, spec, sinks)
