"""The TPU backend: pages in the ragged-paged-attention layout, written in place, one kernel call a layer.

Per attention layer the kernel serves one array (P, ps, 2 KVH / f, f dk): keys and values interleaved on the third
axis (keys even, values odd), as JAX's Pallas `ragged_paged_attention` reads them. A layer it never serves (dk !=
dv, 256-lane heads, head counts it does not tile) keeps keys (P, KVH, ps, dk) and values (P, KVH, ps, dv) apart,
heads-major: the order XLA's page-column loop reads, so XLA does not re-lay the pool for it. f (the fold) packs f
consecutive KV heads into the 128 lanes of a TPU vector register where dk < 128: with dk 64 and an even KVH, KV
heads 2g and 2g+1 take lanes 0-63 and 64-127 of combined head g. The kernel then sees KVH / 2 heads of 128 lanes;
each query is zero-padded to 128 lanes with its values in its own KV head's half, so q.k is its own head's dot
product, and the output keeps that half. The pages hold the same bytes as unfolded ones (the peers pad dk 64 to
128: twice the KV bytes); only the queries' small arithmetic doubles.

Held heads: a KV head count the kernel does not tile (the default model's three KV heads of 64 lanes: 1.5
combined heads' packed rows) is padded with zero heads to the fewest that it does (four: two combined heads);
no real query reads a padded head (queries are padded to match, their outputs dropped), and the pool is
sized by the held count (kv/paged.pool_page_bytes).

Writes: one scatter of whole (2 KVH / f, f dk) rows at [page, offset] (heads-major: (KVH, d) at [page, :, offset])
into the donated pool, in place, so a step copies nothing the size of the pool. Attention: every row of the step (D
decode tokens, then P prompt-chunk rows of C tokens) in one ragged call on a TPU. Elsewhere (a CPU, the tests), and
for what that kernel does not do (sinks, local chunks, image rows that see their whole image, dk != dv, heads not
128 lanes wide, pages of another dtype than the queries), XLA's page-column loop over the layer's pages
(columns.column_attention), which reads only the rows' pages.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .columns import column_attention, with_layer

LANES = 128  # a TPU vector register's lanes: the kernel's head_dim must fill them


def fold_of(heads: int, k_dim: int, v_dim: int) -> int:
    """KV heads that share one 128-lane combined head (1: none share)."""
    if k_dim != v_dim or k_dim >= LANES or LANES % k_dim:
        return 1
    f = LANES // k_dim
    return f if heads % f == 0 else 1


def held_heads(heads: int, k_dim: int, v_dim: int, dtype) -> int:
    """KV heads a layer's pool holds: `heads`, or the fewest more, up to twice as many, that the kernel tiles
    (three KV heads of 64 lanes: four). Layers the kernel cannot serve anyway (dk != dv, heads that never
    make 128 lanes, 256-lane heads) keep their count."""
    if k_dim != v_dim:
        return heads
    for held in range(heads, 2 * heads + 1):
        f = fold_of(held, k_dim, v_dim)
        if kernel_lanes(f * k_dim) and tileable(2 * held // f, dtype):
            return held
    return heads


def kernel_layout(heads: int, k_dim: int, v_dim: int, dtype) -> bool:
    """Whether a layer's pages take the kernel's combined layout (P, ps, 2 KVH / f, f dk). The others, which
    only XLA's page-column loop reads, are kept heads-major, keys (P, KVH, ps, dk) and values (P, KVH, ps, dv):
    in the combined layout a v5e copied each such layer's whole pool into that order every step (the ~0.5B
    dense twin of benchmarks/hybrid_decode.py, head_dim 256: 1.62 ms of its 4.3 ms 32-row decode step,
    `bf16[192,128,4,256]` re-laid after the K/V write; roofline.py --trace, 2026-12-07)."""
    held = held_heads(heads, k_dim, v_dim, dtype)
    f = fold_of(held, k_dim, v_dim)
    return k_dim == v_dim and kernel_lanes(f * k_dim) and tileable(2 * held // f, dtype)


def pad_heads(x, held: int):
    """x (T, H, d) -> (T, held, d): zero heads after the real ones."""
    return x if x.shape[1] == held else jnp.pad(x, ((0, 0), (0, held - x.shape[1]), (0, 0)))


def interleave(k, v, fold: int):
    """k, v (T, KVH, d) -> (T, 2 KVH / f, f d): each token's row of the combined pool."""
    t, kvh, d = k.shape
    packed = jnp.stack([k.reshape(t, kvh // fold, fold * d), v.reshape(t, kvh // fold, fold * d)], axis=2)
    return packed.reshape(t, 2 * kvh // fold, fold * d)


def split_pages(block, kv_heads: int, dtype):
    """block (R, ps, 2 KVH / f, f d) gathered pages -> keys (R, KVH, d, ps), values (R, KVH, ps, d) in dtype
    (the page-column loop's operands)."""
    r, ps, combined, lanes = block.shape
    fold = 2 * kv_heads // combined
    x = block.reshape(r, ps, kv_heads // fold, 2, fold, lanes // fold)
    keys = x[:, :, :, 0].reshape(r, ps, kv_heads, -1).transpose(0, 2, 3, 1)
    values = x[:, :, :, 1].reshape(r, ps, kv_heads, -1).transpose(0, 2, 1, 3)
    return keys.astype(dtype), values.astype(dtype)


def fold_queries(q, kv_heads: int, fold: int):
    """q (N, H, d) -> (N, H, f d): each query in the lanes of its own KV head, zeros elsewhere."""
    if fold == 1:
        return q
    n, h, d = q.shape
    onehot = jax.nn.one_hot(_member(h, kv_heads, fold), fold, dtype=q.dtype)  # (H, f)
    return (q[:, :, None, :] * onehot[None, :, :, None]).reshape(n, h, fold * d)


def unfold_outputs(out, kv_heads: int, fold: int):
    """out (N, H, f d) -> (N, H, d): each head's own KV head's lanes."""
    if fold == 1:
        return out
    n, h, lanes = out.shape
    member = _member(h, kv_heads, fold)[None, :, None, None]
    return jnp.take_along_axis(out.reshape(n, h, fold, lanes // fold), member, axis=2)[:, :, 0]


def _member(heads: int, kv_heads: int, fold: int):
    """(H,) which part of its combined head holds each query head's KV head."""
    return (jnp.arange(heads) // (heads // kv_heads)) % fold


def ragged_inputs(layout, num_pages: int, page_size: int):
    """A step's rows as the ragged kernel's sequences: (kv_lens (S,), page_indices (S, W), cu_q_lens (S + 1,),
    num_seqs (1,)), S = D decode rows + P chunk rows. A chunk row's padding tokens follow its prompt tokens,
    so its kv length counts them (start + C): each real token still sees exactly the keys up to its own
    position, and the table gets ceil(C / ps) more columns for the padding's reach. Padding rows read one key
    (or C) of a clamped page: their outputs are dropped."""
    d, (p, c) = layout.num_decode, layout.chunk_pos.shape
    tables, kv_lens = [], []
    if d:
        tables.append(layout.decode_tables)
        kv_lens.append(jnp.maximum(layout.decode_pos[:, 0] + 1, 1))
    if p:
        tables.append(jnp.pad(layout.chunk_tables, ((0, 0), (0, -(-c // page_size)))))
        start = layout.chunk_pos[:, 0]
        kv_lens.append(jnp.where(start >= 0, start + c, c))
    width = max(t.shape[1] for t in tables)
    pages = jnp.concatenate([jnp.pad(t, ((0, 0), (0, width - t.shape[1]))) for t in tables])
    q_lens = np.array([1] * d + [c] * p)
    cu_q_lens = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32)
    return (jnp.concatenate(kv_lens).astype(jnp.int32), jnp.clip(pages, 0, num_pages - 1).astype(jnp.int32),
            cu_q_lens, jnp.asarray([d + p], jnp.int32))


def ragged_attention(q, pool, layout, spec, kv_heads: int, call=None):
    """q (N, H, d) every token of the step; pool (P, ps, 2 KVH' / f, f d), KVH' >= kv_heads held heads ->
    (N, H, d) through `call` (JAX's Pallas kernel; its pure-JAX reference in the tests: same arguments). Each
    held zero head gets as many zero queries as a real head has; their outputs are dropped."""
    fold = pool.shape[-1] // q.shape[-1]
    held, heads = pool.shape[2] * fold // 2, q.shape[1]
    queries = pad_heads(q, held * (heads // kv_heads))
    args = ragged_inputs(layout, pool.shape[0], pool.shape[1])
    options = {"vmem_limit_bytes": VMEM_LIMIT} if _large_vmem() else {}
    if call is None:
        from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention as call
        options.update(block_sizes(layout, args[1].shape[1]))
    out = call(fold_queries(queries, held, fold), pool, *args, sm_scale=spec.scale, sliding_window=spec.window,
               soft_cap=spec.softcap, **options)
    return unfold_outputs(out, held, fold)[:, :heads]


DECODE_KV_PAGES = 16  # a block's pages at most (16 x 128 tokens): VMEM holds two such blocks of the 8B shape's pages
DECODE_QUERIES = 8  # queries a block on decode-only steps (benchmarks/roofline.py --decode-queries sets it)


def block_sizes(layout, width: int) -> dict:
    """The kernel's block sizes for a step whose page tables are `width` pages wide: JAX's tuned ones ({}) where
    prompt chunks share the step; for decode rows only (one query each) a row's whole page table in one block of
    pages and few queries a block. Measured on a v5e (benchmarks/tpu_attention.py, 513-token rows, 128-token
    pages, less ~0.55 ms of dispatch a call): the tuned sizes 0.88 / 2.49 ms of kernel at 256 rows of the 1B / 3B
    shape, these 0.52 / 1.14 ms; the 3B decode step at 64 rows 26.1 -> 17.3 ms (roofline.py). A query block pads
    each decode row's one query to its size, and a row whose pages span several blocks waits for each in turn."""
    if layout.chunk_pos.shape[0]:
        return {}
    return {"num_kv_pages_per_block": max(1, min(width, DECODE_KV_PAGES)), "num_queries_per_block": DECODE_QUERIES}


@dataclasses.dataclass(frozen=True)
class TpuPages:
    name: str = "tpu"

    K_AXES = ("pages", "page_offset", "kv_heads", "head_dim")  # the combined pools'
    V_AXES = ("pages", "head_dim")  # (their empty value arrays)
    HEADS_MAJOR_AXES = ("pages", "kv_heads", "page_offset", "head_dim")

    def init_pools(self, layers, num_pages: int, page_size: int, dtype) -> tuple[list, list]:
        """Per layer the kernel serves a combined pool (P, ps, 2 KVH / f, f dk) and an empty (P, 0) value array;
        per other layer (kernel_layout) keys (P, KVH, ps, dk) and values (P, KVH, ps, dv) apart, heads-major."""
        if jnp.dtype(dtype) in (jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn)):
            raise ValueError(f"the tpu attention backend stores float pages; kv_cache_dtype {jnp.dtype(dtype).name} "
                             "needs --attention-backend xla")
        k, v = [], []
        for l in layers:
            if kernel_layout(l.heads, l.k_dim, l.v_dim, dtype):
                held = self.held_heads(l, dtype)
                f = fold_of(held, l.k_dim, l.v_dim)
                k.append(jnp.zeros((num_pages, page_size, 2 * held // f, f * l.k_dim), dtype))
                v.append(jnp.zeros((num_pages, 0), dtype))
            else:
                k.append(jnp.zeros((num_pages, l.heads, page_size, l.k_dim), dtype))
                v.append(jnp.zeros((num_pages, l.heads, page_size, l.v_dim), dtype))
        return k, v

    def pool_axes(self, k, v) -> tuple[tuple, tuple]:
        """The logical axes (hardware/sharding.py) of one layer's key and value arrays."""
        if v.ndim == 2:
            return self.K_AXES, self.V_AXES
        return self.HEADS_MAJOR_AXES, self.HEADS_MAJOR_AXES

    @staticmethod
    def held_heads(layer, dtype) -> int:
        """KV heads this backend's pool holds for `layer` (a KVLayer): its own, or more (held_heads above)."""
        return held_heads(layer.heads, layer.k_dim, layer.v_dim, dtype)

    def attend(self, cache, layer, q, k, v, spec, sinks):
        """q (1, N, H, dk), k (1, N, KVH, dk), v (1, N, KVH, dv) -> ((1, N, H, dv), the cache written)."""
        lay, ps = cache.layout, cache.page_size
        page, offset = lay.slot_mapping // ps, lay.slot_mapping % ps  # page num_pages: dropped (padding)
        pool, values = cache.k[layer], cache.v[layer]
        kv_heads, dv = k.shape[2], v.shape[-1]
        combined = values.ndim == 2
        if combined:
            fold = pool.shape[-1] // k.shape[-1]
            held = pool.shape[2] * fold // 2  # kv_heads, or more: zero heads the kernel tiles
            rows = interleave(pad_heads(k[0], held), pad_heads(v[0], held), fold)
            pool = pool.at[page, offset].set(rows.astype(pool.dtype), mode="drop")
            read = lambda ids: tuple(x[:, :kv_heads] for x in split_pages(pool[ids], held, q.dtype))  # noqa: E731
        else:  # heads-major (P, KVH, ps, d): each token's (KVH, d) rows at [page, :, offset]
            pool = pool.at[page, :, offset].set(k[0].astype(pool.dtype), mode="drop")
            values = values.at[page, :, offset].set(v[0].astype(values.dtype), mode="drop")
            read = lambda ids: (pool[ids].transpose(0, 1, 3, 2).astype(q.dtype),  # noqa: E731
                                values[ids].astype(q.dtype))
        cache = with_layer(cache, layer, pool, values)
        if combined and _kernel_serves(q, pool, spec, sinks, lay):
            return ragged_attention(q[0], pool, lay, spec, kv_heads)[None], cache
        d, (p, c) = lay.num_decode, lay.chunk_pos.shape
        heads = q.shape[2]
        parts = []
        if d:
            parts.append(column_attention(q[0, :d, None], read, kv_heads, ps, dv, lay.decode_tables, lay.decode_pos,
                                          spec, sinks, lay.num_columns).reshape(d, heads, dv))
        if p:
            qc = q[0, d:].reshape(p, c, *q.shape[2:])  # (P, C, H, dk)
            parts.append(column_attention(qc, read, kv_heads, ps, dv, lay.chunk_tables, lay.chunk_pos, spec, sinks,
                                          lay.num_columns, lay.chunk_limit).reshape(p * c, heads, dv))
        return (jnp.concatenate(parts) if len(parts) > 1 else parts[0])[None], cache


# the kernel's default 16 MiB of scoped VMEM was too little on a v5e for the 8B shape's 512-token prompt step
# (18.5 MiB) and for the 3B shape's decode at a 2,256-token context (18.1 MiB); v5e and v6e chips have 128 MiB
VMEM_LIMIT = 96 << 20


def _large_vmem() -> bool:
    kind = jax.devices()[0].device_kind.lower()
    return "v5 lite" in kind or "v5e" in kind or "v6" in kind


def _kernel_serves(q, pool, spec, sinks, layout) -> bool:
    return (jax.default_backend() == "tpu" and q.dtype == pool.dtype and kernel_lanes(pool.shape[-1])
            and tileable(pool.shape[2], pool.dtype) and sinks is None and spec.chunk is None
            and layout.chunk_limit is None)


def kernel_lanes(width: int) -> bool:
    """Whether the kernel loads combined heads this wide: exactly 128 lanes. jax 0.10.2's kernel fails to compile
    256 (Gemma's and Qwen3.5's head_dim: Mosaic's strided load says "the last dim size is not 128", measured on a
    v5e), so such layers take XLA's page-column loop."""
    return width == LANES


def tileable(combined_heads: int, dtype) -> bool:
    """Whether the kernel takes this many combined heads: whole (8 x 32-bit) tiles of them, or 1, 2, 4 or 8
    packed rows (jax 0.10.2 refuses others: three KV heads of 128 lanes, say)."""
    packing = 4 // jnp.dtype(dtype).itemsize
    rows, left = divmod(combined_heads, packing)
    return not left and (rows in (1, 2, 4, 8) or rows % 8 == 0)


TPU = TpuPages()
