"""The SigLIP vision tower several vision-language families carry (Idefics3 / SmolVLM, Gemma 3): patch
embedding, learned positions, pre-LayerNorm encoder blocks, a final LayerNorm. Its weights' declarations
(under each family's HF prefix) and its forward pass over whole tiles (ops/vision.py's pieces)."""

from __future__ import annotations

import jax.numpy as jnp

from ..ops import vision as ops
from .spec import Weight, tensor


def vec(name: str, n: int, init: str = "zeros") -> Weight:
    return Weight((n,), (None,), tensor(name, (n,)), None, init=init)


def mat(name: str, n_out: int, n_in: int) -> Weight:  # HF (out, in) -> (in, out)
    return Weight((n_in, n_out), (None, None), tensor(name, (n_out, n_in)), None)


def tower_weights(c, prefix: str) -> dict[str, Weight]:
    """Patch embedding, positions and the final norm; prefix: "model.vision_model" (Idefics3),
    "vision_tower" (Gemma 3)."""
    d, p = c.vision_hidden, c.patch_size
    patches = (c.tile_size[0] // p) * (c.tile_size[1] // p)
    return {
        "patch_w": Weight((d, 3, p, p), (None,) * 4,
                          tensor(f"{prefix}.embeddings.patch_embedding.weight", (d, 3, p, p), matrix=False), None),
        "patch_b": vec(f"{prefix}.embeddings.patch_embedding.bias", d),
        "positions": Weight((patches, d), (None, None),
                            tensor(f"{prefix}.embeddings.position_embedding.weight", (patches, d), matrix=False), None),
        "post_ln": vec(f"{prefix}.post_layernorm.weight", d, "ones"),
        "post_ln_b": vec(f"{prefix}.post_layernorm.bias", d),
    }


def block_weights(c, i: int, prefix: str) -> dict[str, Weight]:
    """Encoder block i's attention, norms and MLP."""
    d, f, pre = c.vision_hidden, c.vision_intermediate, f"{prefix}.encoder.layers.{i}"
    out = {}
    for short, name in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
        out[f"w{short}"] = mat(f"{pre}.self_attn.{name}.weight", d, d)
        out[f"b{short}"] = vec(f"{pre}.self_attn.{name}.bias", d)
    out.update(ln1=vec(f"{pre}.layer_norm1.weight", d, "ones"), ln1_b=vec(f"{pre}.layer_norm1.bias", d),
               ln2=vec(f"{pre}.layer_norm2.weight", d, "ones"), ln2_b=vec(f"{pre}.layer_norm2.bias", d),
               fc1=mat(f"{pre}.mlp.fc1.weight", f, d), fc1_b=vec(f"{pre}.mlp.fc1.bias", f),
               fc2=mat(f"{pre}.mlp.fc2.weight", d, f), fc2_b=vec(f"{pre}.mlp.fc2.bias", d))
    return out


def encode(model, pixels):
    """uint8 (n, H, W, C) whole tiles -> (n, patches, Dv) after the final norm. Every patch is real and its
    position is its index (whole tiles: the references' bucketed positions reduce to that)."""
    c = model.config
    g = model.vision.weights()
    x = ops.normalize_pixels(pixels, c.image_mean, c.image_std, c.rescale_factor)  # (n, 3, H, W)
    h = ops.patch_embed(x, g["patch_w"], g["patch_b"]) + g["positions"].astype(jnp.float32)  # (n, P, Dv)
    for layer in model.vision_layers:
        h = ops.encoder_block(h, layer.weights(), c.vision_heads, c.vision_eps, c.vision_activation)
    return ops.layer_norm(h, g["post_ln"], g["post_ln_b"], c.vision_eps)
