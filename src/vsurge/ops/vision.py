"""Pieces of vision towers (ViT encoders) that several families share: pixels in, patch
embeddings, bidirectional encoder blocks, pixel shuffle. Float32 activations; the towers are
small beside the language model, so they run unquantized."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .linear import mixed_dot
from .norm import rms_norm
from .rope import apply_rope


def normalize_pixels(pixels: jax.Array, mean, std, rescale: float) -> jax.Array:
    """uint8 (n, H, W, C) -> float32 (n, C, H, W): rescaled, then normalized per channel, in the
    order and dtype the HF image processors use (x * rescale, then (x - mean) / std)."""
    x = pixels.astype(jnp.float32) * jnp.float32(rescale)
    x = (x - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)
    return x.transpose(0, 3, 1, 2)


def patchify(images: jax.Array, patch: int) -> jax.Array:
    """(n, C, H, W) -> (n, H/p * W/p, C*p*p): each patch flattened in (channel, row, column) order,
    the order a (D, C, p, p) convolution kernel reads, patches row-major."""
    n, c, h, w = images.shape
    x = images.reshape(n, c, h // patch, patch, w // patch, patch)
    return x.transpose(0, 2, 4, 1, 3, 5).reshape(n, (h // patch) * (w // patch), c * patch * patch)


def patch_embed(images: jax.Array, kernel: jax.Array, bias: jax.Array | None) -> jax.Array:
    """A stride-p convolution: images (n, C, H, W), kernel (D, C, p, p) -> (n, patches, D)."""
    d, _, p, _ = kernel.shape
    return dense(patchify(images, p), kernel.reshape(d, -1).T, bias)


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    """torch.nn.LayerNorm over the last axis, in float32."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + eps) * weight + bias).astype(x.dtype)


def dense(x: jax.Array, w: jax.Array, b: jax.Array | None = None) -> jax.Array:
    """x (..., K) @ w (K, N) (+ b): bfloat16 weights multiply in bfloat16 with float32 accumulation
    (ops/linear.py's mixed dot: twice float32's rate where the CPU has AVX512-BF16)."""
    out = mixed_dot(x, w, 0)
    return out if b is None else out + b.astype(out.dtype)


ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "silu": jax.nn.silu,
}


def _attention_blocks(q, k, v, scale: float, keys=None, one_at_a_time: bool | None = None):
    """Softmax attention of every (group, query block) against its group's keys: q (G, B, h, Q, d), k/v
    (G, h, T, d) -> (G, B, h, Q, d) float32; keys: (G, T) bool, the keys each group's queries see (None: all).
    On a CPU one block at a time: a block's scores (h x Q x T) stay in the caches; all of a tile's at once
    (12 x 1024 x 1024) went to memory and back several times (3x slower on a 2-core machine). Elsewhere
    (one_at_a_time False) every block in one batched product: a loop of 16 tiles x 6 groups x 2 blocks of
    small products a layer leaves an accelerator idle between them."""
    if one_at_a_time is None:
        one_at_a_time = jax.default_backend() == "cpu"
    each = jax.lax.map if one_at_a_time else (lambda fn, xs: jax.vmap(fn)(xs))

    def group(args):
        qg, kg, vg, *seen = args

        def block(qb):
            s = jnp.einsum("hqd,hkd->hqk", qb, kg, preferred_element_type=jnp.float32) * jnp.float32(scale)
            if seen:  # (a padded window's missing keys)
                s = jnp.where(seen[0][None, None, :], s, -jnp.inf)
            p = jnp.exp(s - jnp.max(s, -1, keepdims=True))
            p = p / jnp.sum(p, -1, keepdims=True)
            return jnp.einsum("hqk,hkd->hqd", p.astype(vg.dtype), vg, preferred_element_type=jnp.float32)

        return each(block, qg)

    return each(group, (q, k, v) if keys is None else (q, k, v, keys))


def encoder_attention(x: jax.Array, w: dict, heads: int, query_block: int = 512, heads_per_group: int = 2) -> jax.Array:
    """Bidirectional multi-head attention over each image's patches: x (n, T, D), w: wq/wk/wv/wo (D, D)
    and their biases bq/bk/bv/bo -> (n, T, D). The products run in the weights' dtype (bfloat16 ones
    in bfloat16, accumulated in float32)."""
    n, t, d = x.shape
    hd = d // heads
    dt = w["wq"].dtype if jnp.dtype(w["wq"].dtype).itemsize < jnp.dtype(x.dtype).itemsize else x.dtype
    hp = heads_per_group if heads % heads_per_group == 0 else 1
    qb = query_block if t % query_block == 0 else t
    groups = n * heads // hp

    def split(y):  # (n, T, D) -> (G, hp, T, hd)
        return y.astype(dt).reshape(n, t, heads, hd).transpose(0, 2, 1, 3).reshape(groups, hp, t, hd)

    q, k, v = (split(dense(x, w[f"w{c}"], w.get(f"b{c}"))) for c in "qkv")
    q = q.reshape(groups, hp, t // qb, qb, hd).transpose(0, 2, 1, 3, 4)  # (G, B, hp, qb, hd)
    out = _attention_blocks(q, k, v, hd ** -0.5)  # (G, B, hp, qb, hd)
    out = out.transpose(0, 2, 1, 3, 4).reshape(n, heads, t, hd).transpose(0, 2, 1, 3).reshape(n, t, d)
    return dense(out.astype(x.dtype), w["wo"], w.get("bo"))


def encoder_block(x: jax.Array, w: dict, heads: int, eps: float, activation: str) -> jax.Array:
    """A pre-LayerNorm ViT block (SigLIP, CLIP): x + attn(ln1(x)), then + mlp(ln2(x))."""
    h = layer_norm(x, w["ln1"], w["ln1_b"], eps)
    x = x + encoder_attention(h, w, heads)
    h = layer_norm(x, w["ln2"], w["ln2_b"], eps)
    return x + dense(ACTIVATIONS[activation](dense(h, w["fc1"], w["fc1_b"])), w["fc2"], w["fc2_b"])


def pixel_shuffle(x: jax.Array, factor: int) -> jax.Array:
    """Idefics3's space-to-depth: (n, S*S, D) patches of a square grid -> (n, S*S/f^2, D*f^2),
    each output the f x f block of neighbours, in the reference's (column block, row) order."""
    n, seq, d = x.shape
    side = int(round(seq ** 0.5))
    x = x.reshape(n, side, side // factor, d * factor)
    x = x.transpose(0, 2, 1, 3).reshape(n, side // factor, side // factor, d * factor * factor)
    return x.transpose(0, 2, 1, 3).reshape(n, seq // (factor * factor), d * factor * factor)


# ---------------------------------------------------------------- images at their own size (Qwen-VL, Mistral 3)
def merged_patches(image: jax.Array, patch: int, merge: int, frames: int) -> jax.Array:
    """One image (C, H, W) -> (H/p * W/p, C * frames * p * p) patches, each flattened in the (channel, frame,
    row, column) order a (D, C, frames, p, p) Conv3d kernel reads (a still image is `frames` equal frames),
    in merge-block order: the merge x merge patches one output token folds are consecutive, blocks row-major
    (the order HF's Qwen2-VL image processor writes pixel_values in)."""
    c, h, w = image.shape
    gh, gw = h // patch, w // patch
    x = image.reshape(c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.transpose(1, 4, 2, 5, 0, 3, 6)  # (gh/m, gw/m, m, m, C, p, p)
    x = jnp.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], frames, patch, patch))
    return x.reshape(gh * gw, c * frames * patch * patch)


def merged_grid(rows: int, cols: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) (T,) of each patch of a rows x cols grid in merge-block order (merged_patches)."""
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")

    def order(a):
        return a.reshape(rows // merge, merge, cols // merge, merge).transpose(0, 2, 1, 3).reshape(-1)

    return order(r), order(c)


def _inverse_frequencies(dim: int, theta: float) -> np.ndarray:
    """(dim/2,) float32 1 / theta^(2i / dim), as the references compute them in float32."""
    return (1.0 / np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))).astype(np.float32)


def _axial_tables(rows: np.ndarray, cols: np.ndarray, inv_rows: np.ndarray, inv_cols: np.ndarray):
    """Patch rows/cols (T,) -> cos, sin (T, len(inv_rows) + len(inv_cols)) float32: the first frequencies
    turn with the row, the rest with the column (ops/rope.apply_rope's layout)."""
    angles = np.concatenate([rows[:, None].astype(np.float32) * inv_rows,
                             cols[:, None].astype(np.float32) * inv_cols], -1)
    return np.cos(angles), np.sin(angles)


def axial_rope(rows: np.ndarray, cols: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """A ViT's 2-D rotary tables (Qwen-VL): patch rows/cols (T,) -> cos, sin (T, head_dim/2) float32, rows and
    columns turning the same head_dim/4 frequencies (those of a head_dim/2 rotary)."""
    inv = _inverse_frequencies(head_dim // 2, theta)
    return _axial_tables(rows, cols, inv, inv)


def pixtral_rope(rows: np.ndarray, cols: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """Pixtral's 2-D rotary tables: patch rows/cols (T,) -> cos, sin (T, head_dim/2) float32, the head_dim/2
    frequencies of a 1-D rotary split alternately: the even ones turn with the row, the odd with the column."""
    inv = _inverse_frequencies(head_dim, theta)
    return _axial_tables(rows, cols, inv[0::2], inv[1::2])


def window_groups(rows: int, cols: int, merge: int, window: int) -> np.ndarray:
    """The patches each window attends within: (G, S) int indices into the merge-block order, windows of
    `window` x `window` merged tokens row-major (edge windows smaller: padded with -1), tokens row-major
    within a window. The references reorder the patches window by window and back; attending within index
    groups in place computes the same."""
    lh, lw = rows // merge, cols // merge
    unit = merge * merge
    groups = []
    for r0 in range(0, lh, window):
        for c0 in range(0, lw, window):
            units = [r * lw + c for r in range(r0, min(r0 + window, lh)) for c in range(c0, min(c0 + window, lw))]
            groups.append([u * unit + j for u in units for j in range(unit)])
    out = np.full((len(groups), window * window * unit), -1, np.int64)
    for g, members in enumerate(groups):
        out[g, :len(members)] = members
    return out


def grouped_attention(x: jax.Array, w: dict, heads: int, cos, sin, groups: np.ndarray,
                      query_block: int = 512) -> jax.Array:
    """Bidirectional attention of one image's patches within groups (windows, or one group of all), with
    2-D rotary q/k: x (T, D), w: wq/wk/wv/wo (D, D) and biases, cos/sin (T, hd/2), groups (G, S) static
    indices (-1: none) -> (T, D)."""
    t, d = x.shape
    hd = d // heads
    q, k, v = (dense(x, w[f"w{c}"], w.get(f"b{c}")).reshape(1, t, heads, hd) for c in "qkv")
    q, k = (apply_rope(y, cos[None], sin[None])[0] for y in (q, k))  # (T, h, hd)
    g, s = groups.shape
    qb = min(query_block, s)
    size = -(-s // qb) * qb  # queries in whole blocks: padded with -1
    groups = np.pad(groups, ((0, 0), (0, size - s)), constant_values=-1)
    at = jnp.asarray(np.maximum(groups, 0))

    def gather(y):  # (T, h, hd) -> (G, h, S, hd)
        return y[at].transpose(0, 2, 1, 3)

    qg = gather(q).reshape(g, heads, size // qb, qb, hd).transpose(0, 2, 1, 3, 4)  # (G, B, h, qb, hd)
    out = _attention_blocks(qg, gather(k), gather(v.reshape(t, heads, hd)), hd ** -0.5, jnp.asarray(groups >= 0))
    out = out.transpose(0, 1, 3, 2, 4).reshape(g * size, heads * hd)  # (G*S, D) rows in group order
    where = np.zeros(t, np.int64)  # each patch's row among them
    real = groups.reshape(-1) >= 0
    where[groups.reshape(-1)[real]] = np.flatnonzero(real)
    return dense(out[jnp.asarray(where)].astype(x.dtype), w["wo"], w.get("bo"))


def rms_block(h: jax.Array, w: dict, heads: int, eps: float, activation: str, cos, sin,
              groups: np.ndarray) -> jax.Array:
    """A pre-RMSNorm ViT block with 2-D rotary attention within `groups` and a gated MLP (Qwen2.5-VL, Pixtral):
    h (T, D), w: ln1, ln2, attention (grouped_attention) and gate/up/down with optional biases -> (T, D)."""
    h = h + grouped_attention(rms_norm(h, w["ln1"], eps), w, heads, cos, sin, groups)
    x = rms_norm(h, w["ln2"], eps)
    gated = ACTIVATIONS[activation](dense(x, w["gate"], w.get("gate_b"))) * dense(x, w["up"], w.get("up_b"))
    return h + dense(gated, w["down"], w.get("down_b"))


def rotary_block(h: jax.Array, w: dict, heads: int, eps: float, activation: str, cos, sin,
                 groups: np.ndarray) -> jax.Array:
    """A pre-LayerNorm ViT block with 2-D rotary attention within `groups` and a plain MLP (Qwen2-VL, Qwen3-VL):
    h (T, D), w: ln1, ln2 (with biases), attention (grouped_attention), fc1/fc2 with biases -> (T, D)."""
    h = h + grouped_attention(layer_norm(h, w["ln1"], w["ln1_b"], eps), w, heads, cos, sin, groups)
    x = layer_norm(h, w["ln2"], w["ln2_b"], eps)
    return h + dense(ACTIVATIONS[activation](dense(x, w["fc1"], w["fc1_b"])), w["fc2"], w["fc2_b"])


def unfold_blocks(x: jax.Array, rows: int, cols: int, merge: int) -> jax.Array:
    """torch's unfold of a patch grid into merge x merge blocks (Mistral 3's patch merger): x (rows * cols, D)
    row-major -> (rows/m * cols/m, D * m * m), blocks row-major, each flattened channel-major (d, i, j)."""
    d = x.shape[-1]
    x = x.reshape(rows // merge, merge, cols // merge, merge, d)
    return x.transpose(0, 2, 4, 1, 3).reshape((rows // merge) * (cols // merge), d * merge * merge)


def interpolated_positions(rows: np.ndarray, cols: np.ndarray, grid: tuple[int, int], side: int):
    """A learned side x side position table resampled to a grid (rows, cols patches) bilinearly with aligned
    corners (torch's F.interpolate, as Qwen3-VL's tower does): patch rows/cols (T,) -> (indices (T, 4) into
    the flattened table, weights (T, 4) float32)."""
    def taps(index, size):  # (T,) -> taps (T, 2), weights (T, 2)
        src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
        floor = np.floor(src)
        near = floor[:, None] + np.arange(2)
        weights = np.maximum(np.float32(1) - np.abs(src[:, None] - near), 0).astype(np.float32)
        return np.clip(near, 0, side - 1).astype(np.int64), weights

    (ht, hw), (wt, ww) = taps(rows, grid[0]), taps(cols, grid[1])
    indices = (ht[:, :, None] * side + wt[:, None, :]).reshape(-1, 4)
    return indices, (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4)
