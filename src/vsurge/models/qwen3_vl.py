"""Qwen3-VL (2B to 32B dense): Qwen2.5-VL's way with images (own resolution, M-RoPE: qwen_vl.py) with a
LayerNorm ViT that attends to the whole image, learned positions (a square table interpolated to each
image's grid) beside the 2-D rotary, and deepstack: the features of a few tower blocks, merged like the
last block's, are added to the image tokens' hidden states after the first text layers (VisionConfig
feature_levels). The text model is Qwen3's (q/k norms); its M-RoPE frequencies are interleaved.

HF: Qwen3VLForConditionalGeneration (model_type "qwen3_vl"): model.language_model., model.visual.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import jax.numpy as jnp
import numpy as np

from ..ops import vision as ops
from .qwen3 import Qwen3
from .qwen_vl import TOWER, QwenVisionLM, QwenVLConfig, attention_weights, mat, vec
from .spec import Weight, tensor


@dataclass(frozen=True)
class Qwen3VLConfig(QwenVLConfig):
    mrope_interleaved: bool = True
    positions_side: int = 48  # the learned position table is side x side
    deepstack_blocks: tuple[int, ...] = ()  # tower blocks whose features go to the first text layers


def _merger(pre: str, dv: int, folded: int, d: int, post_shuffle: bool) -> dict[str, Weight]:
    n = folded if post_shuffle else dv
    return {"norm": vec(f"{pre}.norm.weight", n, init="ones"), "norm_b": vec(f"{pre}.norm.bias", n),
            "fc1": mat(f"{pre}.linear_fc1.weight", folded, folded), "fc1_b": vec(f"{pre}.linear_fc1.bias", folded),
            "fc2": mat(f"{pre}.linear_fc2.weight", d, folded), "fc2_b": vec(f"{pre}.linear_fc2.bias", d)}


class Qwen3VL(QwenVisionLM, Qwen3):
    supports_lora = False  # (adapters name model.language_model's projections: not laid out yet)
    name = "qwen3_vl"
    hf_model_types = ("qwen3_vl",)
    hf_architectures = ("Qwen3VLForConditionalGeneration",)
    gguf_architectures = ()
    config_class = Qwen3VLConfig

    @classmethod
    def vision_fields(cls, vision: dict, base, where: str) -> dict:
        side = int(round(int(vision.get("num_position_embeddings", 2304)) ** 0.5))
        blocks = tuple(int(i) for i in vision.get("deepstack_visual_indexes", (8, 16, 24)))
        return dict(positions_side=side, deepstack_blocks=blocks, feature_levels=1 + len(blocks))

    @classmethod
    def vision_weights(cls, c: Qwen3VLConfig) -> dict[str, Weight]:
        dv, p, t = c.vision_hidden, c.patch_size, c.temporal_patch_size
        folded, side = dv * c.merge_size ** 2, c.positions_side
        out = {"patch_w": Weight((dv, 3, t, p, p), (None,) * 5,
                                 tensor(f"{TOWER}.patch_embed.proj.weight", (dv, 3, t, p, p), matrix=False)),
               "patch_b": vec(f"{TOWER}.patch_embed.proj.bias", dv),
               "positions": Weight((side * side, dv), (None, None),
                                   tensor(f"{TOWER}.pos_embed.weight", (side * side, dv), matrix=False))}
        out.update({f"merge_{k}": v for k, v in _merger(f"{TOWER}.merger", dv, folded, c.hidden_size, False).items()})
        for j in range(len(c.deepstack_blocks)):
            pre = f"{TOWER}.deepstack_merger_list.{j}"
            out.update({f"deep{j}_{k}": v for k, v in _merger(pre, dv, folded, c.hidden_size, True).items()})
        return out

    @classmethod
    def vision_layer_weights(cls, c: Qwen3VLConfig, i: int) -> dict[str, Weight]:
        d, f, pre = c.vision_hidden, c.vision_intermediate, f"{TOWER}.blocks.{i}"
        return {"ln1": vec(f"{pre}.norm1.weight", d, init="ones"), "ln1_b": vec(f"{pre}.norm1.bias", d),
                "ln2": vec(f"{pre}.norm2.weight", d, init="ones"), "ln2_b": vec(f"{pre}.norm2.bias", d),
                **attention_weights(pre, d),
                "fc1": mat(f"{pre}.mlp.linear_fc1.weight", f, d), "fc1_b": vec(f"{pre}.mlp.linear_fc1.bias", f),
                "fc2": mat(f"{pre}.mlp.linear_fc2.weight", d, f), "fc2_b": vec(f"{pre}.mlp.linear_fc2.bias", d)}

    def _merge(self, h, g: dict, prefix: str, post_shuffle: bool):
        """(T, Dv) patches -> (T / m^2, D): each merge block's patches concatenated, LayerNormed (before the
        concatenation, or after it: post_shuffle), through the two-layer GELU MLP."""
        c = self.config
        tokens = h.shape[0] // c.merge_size ** 2
        w = {k[len(prefix):]: v for k, v in g.items() if k.startswith(prefix)}
        if post_shuffle:
            x = ops.layer_norm(h.reshape(tokens, -1), w["norm"], w["norm_b"], 1e-6)
        else:
            x = ops.layer_norm(h, w["norm"], w["norm_b"], 1e-6).reshape(tokens, -1)
        x = ops.ACTIVATIONS["gelu"](ops.dense(x, w["fc1"], w["fc1_b"]))
        return ops.dense(x, w["fc2"], w["fc2_b"])

    def encode_images(self, pixels):
        """uint8 (1, H, W, C) one image -> (its tokens, feature_levels * D): each token's embedding, then its
        deepstack features (one per deepstack block, in order)."""
        c: Qwen3VLConfig = self.config
        g = self.vision.weights()
        rows, cols = pixels.shape[1] // c.patch_size, pixels.shape[2] // c.patch_size
        cos, sin, at, weights = _tower_layout(rows, cols, c.merge_size, c.vision_hidden // c.vision_heads,
                                              c.vision_rope_theta, c.positions_side)
        table = g["positions"].astype(jnp.float32)
        h = self.patch_embeddings(pixels, g["patch_b"])  # (T, Dv)
        h = h + jnp.sum(table[jnp.asarray(at)] * jnp.asarray(weights)[:, :, None], axis=1)
        whole = np.arange(rows * cols)[None]
        act, features = ops.ACTIVATIONS[c.vision_activation], []
        for i, layer in enumerate(self.vision_layers):
            w = layer.weights()
            h = h + ops.grouped_attention(ops.layer_norm(h, w["ln1"], w["ln1_b"], c.vision_eps), w, c.vision_heads,
                                          jnp.asarray(cos), jnp.asarray(sin), whole)
            x = ops.layer_norm(h, w["ln2"], w["ln2_b"], c.vision_eps)
            h = h + ops.dense(act(ops.dense(x, w["fc1"], w["fc1_b"])), w["fc2"], w["fc2_b"])
            if i in c.deepstack_blocks:
                features.append(self._merge(h, g, f"deep{c.deepstack_blocks.index(i)}_", True))
        out = jnp.concatenate([self._merge(h, g, "merge_", False), *features], axis=-1)
        return out.astype(self.dtype)  # (tokens, levels * D)


@lru_cache(maxsize=32)
def _tower_layout(rows: int, cols: int, merge: int, head_dim: int, theta: float, side: int):
    """Static per image size: the patches' rotary tables (T, hd/2) and position-table taps (T, 4)."""
    r, c = ops.merged_grid(rows, cols, merge)
    cos, sin = ops.axial_rope(r, c, head_dim, theta)
    return (cos, sin, *ops.interpolated_positions(r, c, (rows, cols), side))
