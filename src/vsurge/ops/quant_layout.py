"""GGUF quantized blocks repacked into the layout the C++ matmul reads, and unpacked again in JAX.

The layout (src/vsurge/kernels/qmatmul_layout.h has the byte offsets): W (N, K) is cut into
tiles of 16 output rows; a tile is a run of groups along K, one group per 32-weight block
(Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) or per 256-weight super-block (Q4_K, Q5_K, Q6_K) of all 16 rows.
Each group keeps the format's bits (the same bytes per weight as GGUF; Q4_K and Q5_K hold their
6-bit scales and mins as bytes, 148 and 180 bytes per 256 weights instead of 144 and 176), with
the 16 rows' integer codes interleaved 4 bytes per row so one SIMD dot product yields 16 (or 8)
output rows. `pack` writes it from a format's codes and scales, `decode_gguf` reads those from
GGUF blocks, and `unpack` (jax.numpy, any device) turns the tiles back into float weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import jax
import jax.numpy as jnp
import numpy as np

Q = gguf.GGMLQuantizationType
TILE_ROWS = 16
BLOCK = 32


@dataclass(frozen=True)
class BlockFormat:
    name: str
    kernel_id: int  # vsurge::Format in qmatmul_layout.h
    qtype: Q
    group_weights: int  # weights of one row in a group: 32, or 256 for K-quants
    group_bytes: int  # bytes of a group (16 rows)
    code_offset: int  # weight = scale * (code - offset) (+ min)

    @property
    def super_block(self) -> bool:
        return self.group_weights == 256


FORMATS = {f.name: f for f in (
    BlockFormat("q8_0", 0, Q.Q8_0, 32, 544, 0),
    BlockFormat("q4_0", 1, Q.Q4_0, 32, 288, 8),
    BlockFormat("q4_1", 2, Q.Q4_1, 32, 320, 0),
    BlockFormat("q5_0", 3, Q.Q5_0, 32, 352, 16),
    BlockFormat("q5_1", 4, Q.Q5_1, 32, 384, 0),
    BlockFormat("q4_k", 5, Q.Q4_K, 256, 2368, 0),
    BlockFormat("q5_k", 6, Q.Q5_K, 256, 2880, 0),
    BlockFormat("q6_k", 7, Q.Q6_K, 256, 3360, 32),
)}
BY_QTYPE = {f.qtype: f for f in FORMATS.values()}


def tile_count(n: int) -> int:
    return -(-n // TILE_ROWS)


def tile_bytes(fmt: BlockFormat, k: int) -> int:
    return k // fmt.group_weights * fmt.group_bytes


# ---------------------------------------------------------------- GGUF blocks -> codes and scales

def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16)[..., 0]


def _nibbles16(qs: np.ndarray) -> np.ndarray:
    """(..., 16) bytes -> (..., 32) codes: low nibbles are weights 0-15, high nibbles 16-31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits32(qh: np.ndarray) -> np.ndarray:
    """(..., 4) bytes of a little-endian uint32 -> (..., 32) bits, bit j for weight j."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins (..., 8) each."""
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, mn


def decode_gguf(raw: np.ndarray, fmt: BlockFormat) -> dict[str, np.ndarray]:
    """raw (N, bytes per row) GGUF blocks -> {"codes": uint8 (N, K), and the scales: "d" / "m" / "dmin"
    float16 per row and group, "sc" / "mn" uint8 (N, groups, 8) (Q4_K, Q5_K), "sc" int8 (N, groups, 16)
    (Q6_K)}. Q8_0's codes are its int8 values as bytes."""
    block, size = gguf.GGML_QUANT_SIZES[fmt.qtype]
    n = raw.shape[0]
    b = np.ascontiguousarray(raw).reshape(n, -1, size)
    if fmt.name == "q8_0":
        return {"codes": b[..., 2:].reshape(n, -1), "d": _f16(b[..., 0:2])}
    if fmt.name in ("q4_0", "q4_1", "q5_0", "q5_1"):
        has_min, five = fmt.name.endswith("_1"), fmt.name.startswith("q5")
        out = {"d": _f16(b[..., 0:2])}
        pos = 2
        if has_min:
            out["m"] = _f16(b[..., 2:4])
            pos = 4
        codes = _nibbles16(b[..., pos + 4 * five:])
        if five:
            codes = codes | (_bits32(b[..., pos:pos + 4]) << 4)
        out["codes"] = codes.reshape(n, -1)
        return out
    if fmt.name in ("q4_k", "q5_k"):
        sc, mn = _k_scales(b[..., 4:16])
        qs = b[..., 16:144] if fmt.name == "q4_k" else b[..., 48:176]
        chunks = qs.reshape(n, -1, 4, 32)  # 4 chunks of 32 bytes: blocks 2c (low nibbles), 2c + 1 (high)
        codes = np.stack([chunks & 0x0F, chunks >> 4], axis=3).reshape(n, -1, 8, 32)
        if fmt.name == "q5_k":
            qh = b[..., 16:48]  # bit j of byte l: the 5th bit of weight l of block j
            codes = codes | ((qh[:, :, None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1) << 4
        return {"codes": codes.reshape(n, -1), "d": _f16(b[..., 0:2]), "dmin": _f16(b[..., 2:4]), "sc": sc, "mn": mn}
    if fmt.name == "q6_k":
        ql = b[..., 0:128].reshape(n, -1, 2, 64)
        qh = b[..., 128:192].reshape(n, -1, 2, 32)
        low = np.concatenate([ql & 0x0F, ql >> 4], axis=-1)  # (.., 2, 128): weights 128 h + 0..127
        high = np.concatenate([(qh >> (2 * i)) & 3 for i in range(4)], axis=-1)
        codes = low | (high << 4)
        return {"codes": codes.reshape(n, -1), "sc": b[..., 192:208].view(np.int8), "d": _f16(b[..., 208:210])}
    raise ValueError(f"no decoder for {fmt.name}")


def encode_gguf(qtype, fields: dict[str, np.ndarray]) -> np.ndarray:
    """decode_gguf's inverse for Q8_0, Q4_0 and Q4_1: {"codes": uint8 (N, K) (Q8_0: int8 bytes),
    "d" (and Q4_1's "m"): (N, K / 32) float} -> GGUF blocks uint8 (N, bytes per row)."""
    fmt = BY_QTYPE[Q(qtype)]
    codes = np.asarray(fields["codes"], np.uint8)
    n, k = codes.shape
    c = codes.reshape(n, k // BLOCK, BLOCK)
    f16 = lambda name: np.asarray(fields[name], np.float16).reshape(n, -1, 1).view(np.uint8)  # noqa: E731
    if fmt.name == "q8_0":
        parts = [f16("d"), c]
    elif fmt.name in ("q4_0", "q4_1"):
        parts = [f16("d")] + ([f16("m")] if fmt.name == "q4_1" else []) + [(c[..., :16] & 0x0F) | (c[..., 16:] << 4)]
    else:
        raise ValueError(f"no encoder for {fmt.name}")
    return np.concatenate(parts, axis=-1).reshape(n, -1)


# ---------------------------------------------------------------- codes and scales -> tiles

def _per_tile(a: np.ndarray, tiles: int) -> np.ndarray:
    """(N, groups, *rest) per-row values -> (tiles, groups, 16 rows, *rest), zero rows padding N."""
    pad = tiles * TILE_ROWS - a.shape[0]
    if pad:
        a = np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)])
    a = a.reshape(tiles, TILE_ROWS, *a.shape[1:])
    return np.moveaxis(a, 1, 2)


def _bytes(a: np.ndarray, tiles: int, groups: int) -> np.ndarray:
    """Any per-tile field -> (tiles, groups, bytes) uint8."""
    return np.ascontiguousarray(a).view(np.uint8).reshape(tiles, groups, -1)


def _code_vectors(codes: np.ndarray, tiles: int) -> np.ndarray:
    """codes (N, K) -> (tiles, K / 32, 8, 64): vector g of a block, byte 4 r + i = row r, column 4 g + i."""
    v = _per_tile(codes.reshape(codes.shape[0], -1, 8, 4), tiles)  # (T, blocks, 16, 8, 4)
    return np.ascontiguousarray(v.transpose(0, 1, 3, 2, 4)).reshape(tiles, -1, 8, 64)


def _planes(v: np.ndarray, five: bool, six: bool) -> np.ndarray:
    """code vectors (T, blocks, 8, 64) -> (T, blocks, bytes): 4-bit plane [+ 5th-bit masks | + bits 4-5]."""
    t, blocks = v.shape[:2]
    parts = [(v[:, :, :4] & 0x0F) | ((v[:, :, 4:] & 0x0F) << 4)]
    if five:
        parts.append(np.packbits((v >> 4) & 1, axis=-1, bitorder="little"))
    if six:
        h = ((v >> 4) & 3).reshape(t, blocks, 2, 4, 64)
        parts.append(sum(h[:, :, :, i] << (2 * i) for i in range(4)).astype(np.uint8))
    return np.concatenate([p.reshape(t, blocks, -1) for p in parts], axis=-1)


def pack(fmt: BlockFormat, fields: dict[str, np.ndarray]) -> np.ndarray:
    """decode_gguf's fields -> tiles (tiles, tile bytes) uint8."""
    codes = fields["codes"]
    n, k = codes.shape
    tiles = tile_count(n)
    groups = k // fmt.group_weights
    v = _code_vectors(codes, tiles)
    f16 = lambda name: _bytes(_per_tile(fields[name].astype(np.float16), tiles), tiles, groups)  # noqa: E731
    if fmt.name == "q8_0":
        parts = [f16("d"), v.reshape(tiles, groups, -1)]
    elif not fmt.super_block:
        parts = [f16("d")] + ([f16("m")] if fmt.name.endswith("_1") else [])
        parts.append(_planes(v, five=fmt.name.startswith("q5"), six=False))
    else:
        # per super-block: d (, dmin), the sub-blocks' scales (block j's 16 rows together), codes of block 0..7
        subs = _planes(v, five=fmt.name == "q5_k", six=fmt.name == "q6_k").reshape(tiles, groups, -1)
        per_sub = lambda name: _bytes(np.swapaxes(_per_tile(fields[name], tiles), 2, 3), tiles, groups)  # noqa: E731
        if fmt.name == "q6_k":
            parts = [f16("d"), per_sub("sc"), subs]
        else:
            parts = [f16("d"), f16("dmin"), per_sub("sc"), per_sub("mn"), subs]
    data = np.concatenate(parts, axis=-1)
    assert data.shape[-1] == fmt.group_bytes, (fmt.name, data.shape)
    return data.reshape(tiles, -1)


def repack_gguf(raw: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    """GGUF blocks (N, bytes per row) -> tiles (tiles, tile bytes) uint8."""
    return pack(fmt, decode_gguf(raw, fmt))


# ---------------------------------------------------------------- tiles -> float weights (jax.numpy)

def _j_f16(b: jax.Array) -> jax.Array:
    """(..., 16 * 2) bytes -> (..., 16) float32."""
    return jax.lax.bitcast_convert_type(b.reshape(*b.shape[:-1], TILE_ROWS, 2), jnp.float16).astype(jnp.float32)


def _j_codes(planes: jax.Array, five: bool, six: bool) -> jax.Array:
    """(T, blocks, bytes) planes -> codes (T, blocks, 8, 64) uint8 (inverse of _planes)."""
    t, blocks = planes.shape[:2]
    p = planes[..., :256].reshape(t, blocks, 4, 64)
    v = jnp.concatenate([p & 0x0F, p >> 4], axis=2)
    if five:
        masks = planes[..., 256:320].reshape(t, blocks, 8, 8)
        bits = (masks[..., None] >> jnp.arange(8, dtype=jnp.uint8)) & 1  # (T, blocks, 8, 8 bytes, 8 bits)
        v = v | (bits.reshape(t, blocks, 8, 64) << 4)
    if six:
        h = planes[..., 256:384].reshape(t, blocks, 2, 1, 64)
        shifts = (2 * jnp.arange(4, dtype=jnp.uint8)).reshape(1, 1, 1, 4, 1)
        v = v | ((((h >> shifts) & 3) << 4).reshape(t, blocks, 8, 64))
    return v


def _j_rows(per_tile: jax.Array, n: int) -> jax.Array:
    """(T, groups, 16, *rest) -> (N, groups, *rest)."""
    a = jnp.moveaxis(per_tile, 2, 1)
    return a.reshape(-1, *a.shape[2:])[:n]


def unpack(data: jax.Array, fmt: BlockFormat, n: int, k: int, dtype=jnp.float32) -> jax.Array:
    """tiles (T, tile bytes) uint8 -> W (N, K) in `dtype` (computed in float32)."""
    t = data.shape[0]
    groups = k // fmt.group_weights
    g = data.reshape(t, groups, fmt.group_bytes)
    blocks = k // BLOCK

    def codes_of(v):  # (T, blocks, 8, 64) -> (N, blocks, 32)
        c = v.reshape(t, blocks, 8, TILE_ROWS, 4).transpose(0, 1, 3, 2, 4).reshape(t, blocks, TILE_ROWS, 32)
        return _j_rows(c, n)

    if fmt.name == "q8_0":
        codes = codes_of(g[..., 32:].reshape(t, blocks, 8, 64)).view(jnp.int8).astype(jnp.float32)
        w = codes * _j_rows(_j_f16(g[..., :32]), n)[..., None]
    elif not fmt.super_block:
        has_min = fmt.name.endswith("_1")
        start = 64 if has_min else 32
        v = _j_codes(g[..., start:], five=fmt.name.startswith("q5"), six=False)
        codes = codes_of(v).astype(jnp.float32) - fmt.code_offset
        w = codes * _j_rows(_j_f16(g[..., :32]), n)[..., None]
        if has_min:
            w = w + _j_rows(_j_f16(g[..., 32:64]), n)[..., None]
    else:
        head = 288 if fmt.name == "q6_k" else 320
        sub_bytes = (fmt.group_bytes - head) // 8
        v = _j_codes(g[..., head:].reshape(t, blocks, sub_bytes), five=fmt.name == "q5_k", six=fmt.name == "q6_k")
        codes = codes_of(v).astype(jnp.float32).reshape(n, groups, 8, 32)
        d = _j_rows(_j_f16(g[..., :32]), n)[:, :, None, None]  # (N, groups, 1, 1)
        if fmt.name == "q6_k":
            sc = g[..., 32:288].reshape(t, groups, 16, TILE_ROWS).view(jnp.int8).astype(jnp.float32)
            sc = _j_rows(jnp.swapaxes(sc, 2, 3), n).reshape(n, groups, 8, 2, 1)
            w = (d[..., None] * sc * (codes.reshape(n, groups, 8, 2, 16) - 32)).reshape(n, groups, 8, 32)
        else:
            per_sub = lambda a: _j_rows(jnp.swapaxes(a.reshape(t, groups, 8, TILE_ROWS), 2, 3), n)  # noqa: E731
            sc = per_sub(g[..., 64:192]).astype(jnp.float32)[..., None]
            mn = per_sub(g[..., 192:320]).astype(jnp.float32)[..., None]
            dmin = _j_rows(_j_f16(g[..., 32:64]), n)[:, :, None, None]
            w = d * sc * codes - dmin * mn
    return w.reshape(n, k).astype(dtype)
