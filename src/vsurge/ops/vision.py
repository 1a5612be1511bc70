"""Pieces of vision towers (ViT encoders) that several families share: pixels in, patch
embeddings, bidirectional encoder blocks, pixel shuffle. Float32 activations; the towers are
small beside the language model, so they run unquantized."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .linear import mixed_dot


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


def _attention_blocks(q, k, v, scale: float):
    """Softmax attention of every (group, query block) against its group's keys, one block at a time:
    q (G, B, h, Q, d), k/v (G, h, T, d) -> (G, B, h, Q, d) float32. A block's scores (h x Q x T) stay in
    the CPU's caches; all of a tile's at once (12 x 1024 x 1024) went to memory and back several times
    (3x slower on a 2-core machine)."""
    def group(args):
        qg, kg, vg = args

        def block(qb):
            s = jnp.einsum("hqd,hkd->hqk", qb, kg, preferred_element_type=jnp.float32) * jnp.float32(scale)
            p = jnp.exp(s - jnp.max(s, -1, keepdims=True))
            p = p / jnp.sum(p, -1, keepdims=True)
            return jnp.einsum("hqk,hkd->hqd", p.astype(vg.dtype), vg, preferred_element_type=jnp.float32)

        return jax.lax.map(block, qg)

    return jax.lax.map(group, (q, k, v))


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
