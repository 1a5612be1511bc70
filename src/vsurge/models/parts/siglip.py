"""The SigLIP vision tower several vision-language families carry (Idefics3 / SmolVLM, Gemma 3): patch
embedding, learned positions, pre-LayerNorm encoder blocks, a final LayerNorm. Its weights' declarations
(under each family's HF prefix, and under llama.cpp's mmproj names, which its converter stores as HF
does) and its forward pass over whole tiles (ops/vision.py's pieces)."""

from __future__ import annotations

import jax.numpy as jnp

from ...ops import vision as ops
from .spec import Weight, paired

# HF name under the tower's prefix -> llama.cpp's mmproj name (the `gguf` package's MMPROJ name map)
GGUF_TOWER = {"embeddings.patch_embedding": "v.patch_embd", "embeddings.position_embedding": "v.position_embd",
              "post_layernorm": "v.post_ln"}
GGUF_BLOCK = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.out_proj": "attn_out", "layer_norm1": "ln1", "layer_norm2": "ln2", "mlp.fc1": "ffn_up",
              "mlp.fc2": "ffn_down"}


def vec(name: str, n: int, init: str = "zeros", gguf: str | None = None) -> Weight:
    return Weight((n,), (None,), *paired(name, gguf, (n,)), init=init)


def mat(name: str, n_out: int, n_in: int, gguf: str | None = None) -> Weight:  # HF (out, in) -> (in, out)
    return Weight((n_in, n_out), (None, None), *paired(name, gguf, (n_out, n_in)))


def tower_weights(c, prefix: str) -> dict[str, Weight]:
    """Patch embedding, positions and the final norm; prefix: "model.vision_model" (Idefics3),
    "vision_tower" (Gemma 3)."""
    d, p = c.vision_hidden, c.patch_size
    patches = (c.tile_size[0] // p) * (c.tile_size[1] // p)

    def at(part: str, leaf: str) -> tuple[str, str]:  # (HF name, mmproj name)
        return f"{prefix}.{part}.{leaf}", f"{GGUF_TOWER[part]}.{leaf}"

    return {
        "patch_w": Weight((d, 3, p, p), (None,) * 4,
                          *paired(*at("embeddings.patch_embedding", "weight"), (d, 3, p, p), matrix=False)),
        "patch_b": Weight((d,), (None,), *paired(*at("embeddings.patch_embedding", "bias"), (d,)), init="zeros"),
        "positions": Weight((patches, d), (None, None),
                            *paired(*at("embeddings.position_embedding", "weight"), (patches, d), matrix=False)),
        "post_ln": Weight((d,), (None,), *paired(*at("post_layernorm", "weight"), (d,)), init="ones"),
        "post_ln_b": Weight((d,), (None,), *paired(*at("post_layernorm", "bias"), (d,)), init="zeros"),
    }


def block_weights(c, i: int, prefix: str) -> dict[str, Weight]:
    """Encoder block i's attention, norms and MLP."""
    d, f = c.vision_hidden, c.vision_intermediate

    def at(part: str, leaf: str) -> dict:  # the HF name and, as `gguf`, the mmproj name
        return dict(name=f"{prefix}.encoder.layers.{i}.{part}.{leaf}", gguf=f"v.blk.{i}.{GGUF_BLOCK[part]}.{leaf}")

    out = {}
    for short, name in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
        out[f"w{short}"] = mat(n_out=d, n_in=d, **at(f"self_attn.{name}", "weight"))
        out[f"b{short}"] = vec(n=d, **at(f"self_attn.{name}", "bias"))
    for norm in ("1", "2"):
        out[f"ln{norm}"] = vec(n=d, init="ones", **at(f"layer_norm{norm}", "weight"))
        out[f"ln{norm}_b"] = vec(n=d, **at(f"layer_norm{norm}", "bias"))
    out.update(fc1=mat(n_out=f, n_in=d, **at("mlp.fc1", "weight")), fc1_b=vec(n=f, **at("mlp.fc1", "bias")),
               fc2=mat(n_out=d, n_in=f, **at("mlp.fc2", "weight")), fc2_b=vec(n=d, **at("mlp.fc2", "bias")))
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
