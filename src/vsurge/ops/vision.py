"""Pieces of vision towers (ViT encoders) that several families share: pixels in, patch
embeddings, bidirectional encoder blocks, pixel shuffle. Float32 activations; the towers are
small beside the language model, so they run unquantized."""

from __future__ import annotations

import jax
import jax.numpy as jnp


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
    out = patchify(images, p) @ kernel.reshape(d, -1).T.astype(images.dtype)
    return out if bias is None else out + bias.astype(out.dtype)


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    """torch.nn.LayerNorm over the last axis, in float32."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + eps) * weight + bias).astype(x.dtype)


def dense(x: jax.Array, w: jax.Array, b: jax.Array | None = None) -> jax.Array:
    """x (..., K) @ w (K, N) (+ b)."""
    out = jnp.matmul(x, w.astype(x.dtype))
    return out if b is None else out + b.astype(out.dtype)


ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "silu": jax.nn.silu,
}


def encoder_attention(x: jax.Array, w: dict, heads: int, mask: jax.Array | None = None) -> jax.Array:
    """Bidirectional multi-head attention: x (n, T, D), w: wq/wk/wv/wo (D, D) and their biases
    bq/bk/bv/bo; mask (n, T) bool of the real patches (None: all) -> (n, T, D)."""
    n, t, d = x.shape
    hd = d // heads

    def split(y):  # (n, T, D) -> (n, H, T, hd)
        return y.reshape(n, t, heads, hd).transpose(0, 2, 1, 3)

    q = split(dense(x, w["wq"], w.get("bq")))
    k = split(dense(x, w["wk"], w.get("bk")))
    v = split(dense(x, w["wv"], w.get("bv")))
    scores = jnp.einsum("nhqd,nhkd->nhqk", q, k) * jnp.float32(hd ** -0.5)
    if mask is not None:
        scores = jnp.where(mask[:, None, None, :], scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(x.dtype)
    out = jnp.einsum("nhqk,nhkd->nhqd", probs, v).transpose(0, 2, 1, 3).reshape(n, t, d)
    return dense(out, w["wo"], w.get("bo"))


def encoder_block(x: jax.Array, w: dict, heads: int, eps: float, activation: str,
                  mask: jax.Array | None = None) -> jax.Array:
    """A pre-LayerNorm ViT block (SigLIP, CLIP): x + attn(ln1(x)), then + mlp(ln2(x))."""
    h = layer_norm(x, w["ln1"], w["ln1_b"], eps)
    x = x + encoder_attention(h, w, heads, mask)
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
