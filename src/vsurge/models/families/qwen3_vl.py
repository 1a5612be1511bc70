"""Qwen3-VL (2B to 32B dense): Qwen2.5-VL's way with images (own resolution, M-RoPE: qwen_vl.py) with a
LayerNorm ViT that attends to the whole image, learned positions (a square table interpolated to each
image's grid) beside the 2-D rotary, and deepstack: the features of a few tower blocks, merged like the
last block's, are added to the image tokens' hidden states after the first text layers (VisionConfig
feature_levels). The text model is Qwen3's (q/k norms); its M-RoPE frequencies are interleaved.

HF: Qwen3VLForConditionalGeneration (model_type "qwen3_vl"): model.language_model., model.visual.
llama.cpp: a `qwen3vl` text GGUF and an mmproj of projector type "qwen3vl_merger" (the merger as mm.0 / mm.2
after v.post_ln, a deepstack merger under its tower block's index: v.deepstack.<block>.*).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import jax.numpy as jnp
import numpy as np

from ...ops import vision as ops
from .qwen3 import Qwen3
from ..parts.qwen_vl import TOWER, QwenVisionLM, QwenVLConfig, attention_weights, mat, merged_tokens, patch_weight, vec
from ..parts.spec import Weight, paired


@dataclass(frozen=True)
class Qwen3VLConfig(QwenVLConfig):
    mrope_interleaved: bool = True
    positions_side: int = 48  # the learned position table is side x side
    deepstack_blocks: tuple[int, ...] = ()  # tower blocks whose features go to the first text layers


def _merger(pre: str, dv: int, folded: int, d: int, post_shuffle: bool, gguf: dict[str, str]) -> dict[str, Weight]:
    """gguf: the mmproj's name of each part ("norm", "fc1", "fc2")."""
    n = folded if post_shuffle else dv
    out = {}
    for part, n_out, n_in in (("norm", n, None), ("fc1", folded, folded), ("fc2", d, folded)):
        hf = f"{pre}.{'norm' if part == 'norm' else 'linear_' + part}"
        out[part] = (vec(f"{hf}.weight", n_out, init="ones", gguf=f"{gguf[part]}.weight") if n_in is None else
                     mat(f"{hf}.weight", n_out, n_in, gguf=f"{gguf[part]}.weight"))
        out[f"{part}_b"] = vec(f"{hf}.bias", n_out, gguf=f"{gguf[part]}.bias")
    return out


class Qwen3VisionTower(QwenVisionLM):
    """Qwen3-VL's tower, merger and deepstack: a mixin before the text family (Qwen3VL, Qwen3VLMoe)."""

    supports_lora = False  # (adapters name model.language_model's projections: not laid out yet)
    mmproj_projector = "qwen3vl_merger"

    @classmethod
    def vision_fields(cls, vision: dict, base, where: str) -> dict:
        side = int(round(int(vision.get("num_position_embeddings", 2304)) ** 0.5))
        blocks = tuple(int(i) for i in vision.get("deepstack_visual_indexes", (8, 16, 24)))
        return dict(positions_side=side, deepstack_blocks=blocks, feature_levels=1 + len(blocks))

    @classmethod
    def mmproj_fields(cls, mm) -> dict:
        deep = mm.key("vision.is_deepstack_layers") or []
        blocks = tuple(i for i, on in enumerate(deep) if on)
        patch, size = int(mm.key("vision.patch_size", required=True)), int(mm.key("vision.image_size", required=True))
        return dict(positions_side=size // patch, deepstack_blocks=blocks, feature_levels=1 + len(blocks),
                    mrope_interleaved=True)

    @classmethod
    def vision_weights(cls, c: Qwen3VLConfig) -> dict[str, Weight]:
        dv, side = c.vision_hidden, c.positions_side
        folded = dv * c.merge_size ** 2
        out = {"patch_w": patch_weight(c), "patch_b": vec(f"{TOWER}.patch_embed.proj.bias", dv, gguf="v.patch_embd.bias"),
               "positions": Weight((side * side, dv), (None, None),
                                   *paired(f"{TOWER}.pos_embed.weight", "v.position_embd.weight", (side * side, dv),
                                           matrix=False))}
        merger = _merger(f"{TOWER}.merger", dv, folded, c.hidden_size, False,
                         {"norm": "v.post_ln", "fc1": "mm.0", "fc2": "mm.2"})
        out.update({f"merge_{k}": v for k, v in merger.items()})
        for j, block in enumerate(c.deepstack_blocks):
            pre, gg = f"{TOWER}.deepstack_merger_list.{j}", f"v.deepstack.{block}"
            deep = _merger(pre, dv, folded, c.hidden_size, True, {k: f"{gg}.{k}" for k in ("norm", "fc1", "fc2")})
            out.update({f"deep{j}_{k}": v for k, v in deep.items()})
        return out

    @classmethod
    def vision_layer_weights(cls, c: Qwen3VLConfig, i: int) -> dict[str, Weight]:
        d, f, pre, gg = c.vision_hidden, c.vision_intermediate, f"{TOWER}.blocks.{i}", f"v.blk.{i}"
        out = attention_weights(pre, d, gg, split_qkv=False)
        for n in ("1", "2"):
            out[f"ln{n}"] = vec(f"{pre}.norm{n}.weight", d, init="ones", gguf=f"{gg}.ln{n}.weight")
            out[f"ln{n}_b"] = vec(f"{pre}.norm{n}.bias", d, gguf=f"{gg}.ln{n}.bias")
        for n, part, n_out, n_in in (("1", "up", f, d), ("2", "down", d, f)):
            out[f"fc{n}"] = mat(f"{pre}.mlp.linear_fc{n}.weight", n_out, n_in, gguf=f"{gg}.ffn_{part}.weight")
            out[f"fc{n}_b"] = vec(f"{pre}.mlp.linear_fc{n}.bias", n_out, gguf=f"{gg}.ffn_{part}.bias")
        return out

    def _merge(self, h, g: dict, prefix: str, post_shuffle: bool):
        """(T, Dv) patches -> (T / m^2, D) through the merger whose weights are named `prefix`*."""
        w = {k[len(prefix):]: v for k, v in g.items() if k.startswith(prefix)}
        return merged_tokens(h, w, self.config.merge_size, post_shuffle)

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
        features = []
        for i, layer in enumerate(self.vision_layers):
            h = ops.rotary_block(h, layer.weights(), c.vision_heads, c.vision_eps, c.vision_activation,
                                 jnp.asarray(cos), jnp.asarray(sin), whole)
            if i in c.deepstack_blocks:
                features.append(self._merge(h, g, f"deep{c.deepstack_blocks.index(i)}_", True))
        out = jnp.concatenate([self._merge(h, g, "merge_", False), *features], axis=-1)
        return out.astype(self.dtype)  # (tokens, levels * D)


class Qwen3VL(Qwen3VisionTower, Qwen3):
    name = "qwen3_vl"
    hf_architectures = ("Qwen3VLForConditionalGeneration",)
    gguf_architectures = ()  # (a text GGUF alone is a Qwen3's; with its mmproj: config_from_mmproj)
    mmproj_text_architecture = "qwen3vl"
    config_class = Qwen3VLConfig


@lru_cache(maxsize=32)
def _tower_layout(rows: int, cols: int, merge: int, head_dim: int, theta: float, side: int):
    """Static per image size: the patches' rotary tables (T, hd/2) and position-table taps (T, 4)."""
    r, c = ops.merged_grid(rows, cols, merge)
    cos, sin = ops.axial_rope(r, c, head_dim, theta)
    return (cos, sin, *ops.interpolated_positions(r, c, (rows, cols), side))
