"""Qwen2-VL (2B, 7B, 72B): Qwen2.5-VL's way with images (own resolution, 2-D rotary ViT, 2 x 2 merger, a Qwen2
text model with M-RoPE: qwen_vl.py) before its windows and RMSNorm: LayerNorm blocks with a plain MLP
(quick GELU) that attend to the whole image, a merger that LayerNorms each patch.

HF: Qwen2VLForConditionalGeneration (model_type "qwen2_vl"): the tower's width is vision_config.embed_dim
(its hidden_size is the text model's), its MLP embed_dim x mlp_ratio wide.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import jax.numpy as jnp
import numpy as np

from ...ops import vision as ops
from .qwen2 import Qwen2
from ..parts.qwen_vl import TOWER, QwenVisionLM, QwenVLConfig, attention_weights, mat, merged_tokens, patch_weight, vec
from ..parts.spec import Weight


@dataclass(frozen=True)
class Qwen2VLConfig(QwenVLConfig):
    pass


class Qwen2VL(QwenVisionLM, Qwen2):
    supports_lora = False  # (adapters name model.language_model's projections: not laid out yet)
    name = "qwen2_vl"
    hf_architectures = ("Qwen2VLForConditionalGeneration",)
    gguf_architectures = ()
    config_class = Qwen2VLConfig

    @classmethod
    def vision_fields(cls, vision: dict, base, where: str) -> dict:
        width = int(vision.get("embed_dim", 1280))
        return dict(vision_hidden=width, vision_intermediate=int(width * float(vision.get("mlp_ratio", 4))),
                    vision_activation=vision.get("hidden_act", "quick_gelu"))

    @classmethod
    def vision_weights(cls, c: Qwen2VLConfig) -> dict[str, Weight]:
        dv, pre = c.vision_hidden, f"{TOWER}.merger"
        folded = dv * c.merge_size ** 2
        return {"patch_w": patch_weight(c),
                "merge_norm": vec(f"{pre}.ln_q.weight", dv, init="ones"), "merge_norm_b": vec(f"{pre}.ln_q.bias", dv),
                "merge_fc1": mat(f"{pre}.mlp.0.weight", folded, folded), "merge_fc1_b": vec(f"{pre}.mlp.0.bias", folded),
                "merge_fc2": mat(f"{pre}.mlp.2.weight", c.hidden_size, folded),
                "merge_fc2_b": vec(f"{pre}.mlp.2.bias", c.hidden_size)}

    @classmethod
    def vision_layer_weights(cls, c: Qwen2VLConfig, i: int) -> dict[str, Weight]:
        d, f, pre = c.vision_hidden, c.vision_intermediate, f"{TOWER}.blocks.{i}"
        out = attention_weights(pre, d)  # (HF directories only: no mmproj names)
        for n in ("1", "2"):
            out[f"ln{n}"] = vec(f"{pre}.norm{n}.weight", d, init="ones")
            out[f"ln{n}_b"] = vec(f"{pre}.norm{n}.bias", d)
        out.update(fc1=mat(f"{pre}.mlp.fc1.weight", f, d), fc1_b=vec(f"{pre}.mlp.fc1.bias", f),
                   fc2=mat(f"{pre}.mlp.fc2.weight", d, f), fc2_b=vec(f"{pre}.mlp.fc2.bias", d))
        return out

    def encode_images(self, pixels):
        """uint8 (1, H, W, C) one image -> (H*W / (p*m)^2, D) embeddings, in the image's token order."""
        c: Qwen2VLConfig = self.config
        rows, cols = pixels.shape[1] // c.patch_size, pixels.shape[2] // c.patch_size
        cos, sin = _tower_layout(rows, cols, c.merge_size, c.vision_hidden // c.vision_heads, c.vision_rope_theta)
        whole = np.arange(rows * cols)[None]
        h = self.patch_embeddings(pixels)  # (T, Dv)
        for layer in self.vision_layers:
            h = ops.rotary_block(h, layer.weights(), c.vision_heads, c.vision_eps, c.vision_activation,
                                 jnp.asarray(cos), jnp.asarray(sin), whole)
        merger = {k[len("merge_"):]: v for k, v in self.vision.weights().items() if k.startswith("merge_")}
        return merged_tokens(h, merger, c.merge_size).astype(self.dtype)  # (tokens, D)


@lru_cache(maxsize=32)
def _tower_layout(rows: int, cols: int, merge: int, head_dim: int, theta: float):
    """Static per image size: the patches' rotary tables (T, hd/2)."""
    r, c = ops.merged_grid(rows, cols, merge)
    return ops.axial_rope(r, c, head_dim, theta)
