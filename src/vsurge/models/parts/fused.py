"""The column layouts of the fused matrices, chosen so that any column shard holds whole units.

    wqkv (D, KVH * (G + 2) * hd)   one group per KV head j: [q heads j*G .. j*G+G-1 | k_j | v_j]
                                   (G = H / KVH query heads share each KV head)
    w_gate_up (D, 2F)              gate and up interleaved per unit: column 2f = gate f, 2f + 1 = up f

Splitting the columns over a `model` mesh axis of size tp (tp dividing KVH, and F)
gives every device whole KV groups (the query heads that read those KV heads) and
matching gate/up columns, so attention and the SiLU gate run without
communication. The layouts do not depend on tp: one checkpoint layout serves
every mesh. The query head order stays HF's (head h = j*G + g), so `wo` rows are
not permuted.

When tp does not divide the KV heads, KV heads are replicated (as vLLM does):
`replicate_kv_groups` turns KVH groups of G query heads into KVH*r groups of G/r
query heads, each with a copy of its KV head. The model is then an exact GQA
model with KVH*r KV heads; every device keeps its own copy in its KV cache.
"""

from __future__ import annotations

import numpy as np

from ...config import ModelConfig
from ...ops.linear import settled
from ...ops.mlp import split_gate_up  # noqa: F401  (the traced half of the gate/up layout)


# ------------------------------------------------------------------ inside the model (traced)
def split_qkv(qkv, config: ModelConfig):
    """qkv (B, T, KVH*(G+2)*hd) -> q (B, T, H, hd), k (B, T, KVH, hd), v (B, T, KVH, hd)."""
    b, t, _ = qkv.shape
    c = config
    groups = settled(qkv).reshape(b, t, c.num_kv_heads, c.num_heads // c.num_kv_heads + 2, c.head_dim)
    q = groups[:, :, :, :-2].reshape(b, t, c.num_heads, c.head_dim)
    return q, groups[:, :, :, -2], groups[:, :, :, -1]


# ------------------------------------------------------------------ building the layouts (host numpy)
def qkv_group_width(config: ModelConfig) -> int:
    """Columns of one KV group of wqkv."""
    return (config.num_heads // config.num_kv_heads + 2) * config.head_dim


def fuse_qkv_rows(q, k, v, config: ModelConfig, first_group: int = 0, kv_replicas: int = 1):
    """HF-layout rows (out, ...) of whole groups -> the fused rows, group by group.

    q: rows of query heads [first_group*G', (first_group+n)*G') where G' = H / (KVH*kv_replicas);
    k, v: rows of the original KV heads those groups read, starting at first_group // kv_replicas.
    Works for 2-D weights (rows, D) and 1-D biases (rows,). Returns (n*(G'+2)*hd, ...)."""
    c, hd = config, config.head_dim
    g = c.num_heads // (c.num_kv_heads * kv_replicas)
    n = q.shape[0] // (g * hd)
    first_kv = first_group // kv_replicas
    parts = []
    for j in range(first_group, first_group + n):
        local, kv = j - first_group, j // kv_replicas - first_kv
        parts += [q[local * g * hd:(local + 1) * g * hd], k[kv * hd:(kv + 1) * hd], v[kv * hd:(kv + 1) * hd]]
    return np.concatenate(parts, axis=0)


def interleave_gate_up_rows(gate, up):
    """HF rows gate (F', ...) and up (F', ...) -> (2F', ...) with gate f at row 2f and up f at 2f + 1."""
    return np.stack([gate, up], axis=1).reshape(2 * gate.shape[0], *gate.shape[1:])


def replicate_kv_groups(columns, config: ModelConfig, factor: int):
    """Fused qkv columns (..., KVH*(G+2)*hd) -> (..., KVH*factor*(G/factor+2)*hd): each KV head
    copied to `factor` groups, each taking G/factor of its query heads. Works on weights,
    biases and int8 scales (any array whose last axis is the fused columns)."""
    c, hd = config, config.head_dim
    g = c.num_heads // c.num_kv_heads
    lead = columns.shape[:-1]
    groups = columns.reshape(*lead, c.num_kv_heads, g + 2, hd)
    q = groups[..., :g, :].reshape(*lead, c.num_kv_heads, factor, g // factor, hd)
    kv = np.broadcast_to(groups[..., None, g:, :], (*lead, c.num_kv_heads, factor, 2, hd))
    out = np.concatenate([q, kv], axis=-2)  # (..., KVH, factor, G/factor + 2, hd)
    return out.reshape(*lead, c.num_kv_heads * factor * (g // factor + 2) * hd)


def unfuse_qkv(columns, config: ModelConfig):
    """Fused qkv columns (..., KVH*(G+2)*hd) -> HF-ordered q (..., Q), k (..., K), v (..., K)."""
    c = config
    lead = columns.shape[:-1]
    groups = columns.reshape(*lead, c.num_kv_heads, c.num_heads // c.num_kv_heads + 2, c.head_dim)
    q = groups[..., :-2, :].reshape(*lead, c.q_size)
    return q, groups[..., -2, :].reshape(*lead, c.kv_size), groups[..., -1, :].reshape(*lead, c.kv_size)
