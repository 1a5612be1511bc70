"""Qwen2.5-VL (3B, 7B, 32B, 72B): images at their own resolution through a window-attention ViT, a Qwen2
text model whose rotary positions are 3-D (M-RoPE: qwen_vl.py).

The tower: an image resized to whole 2 x 2 blocks of 14-pixel patches (multimodal/qwen2_vl.py), each
patch repeated to 2 frames and embedded by a Conv3d (a matmul on flattened patches), RMSNorm blocks with
SwiGLU MLPs and 2-D rotary q/k (a patch's row turns half the frequencies, its column the rest), attending
within windows of `window_size` pixels except in the `fullatt_block_indexes` blocks (whole image); the
merger folds each 2 x 2 block into one token at the text model's width.

HF: Qwen2_5_VLForConditionalGeneration (model_type "qwen2_5_vl"): the text model under model. (the hub's
layout) or model.language_model., the tower under visual. or model.visual.; config.json flat (the hub's)
or with text_config (transformers 5). llama.cpp: a `qwen2vl` text GGUF and an mmproj of projector type
"qwen2.5vl_merger" (its converter splits the qkv and the Conv3d's two frames; the window layout as
clip.n_wa_pattern: every n-th block attends to the whole image).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import jax.numpy as jnp
import numpy as np

from ...ops import vision as ops
from ...ops.norm import rms_norm
from .qwen2 import Qwen2
from ..parts.qwen_vl import TOWER, QwenVisionLM, QwenVLConfig, attention_weights, mat, patch_weight, vec
from ..parts.spec import Weight


@dataclass(frozen=True)
class Qwen25VLConfig(QwenVLConfig):
    window_size: int = 112  # pixels per side of an attention window
    fullatt_blocks: tuple[int, ...] = ()  # tower blocks that attend to the whole image


class Qwen25VL(QwenVisionLM, Qwen2):
    supports_lora = False  # (adapters name model.language_model's projections: not laid out yet)
    name = "qwen2_5_vl"
    hf_architectures = ("Qwen2_5_VLForConditionalGeneration",)
    gguf_architectures = ()  # (a text GGUF alone is a Qwen2's; with its mmproj: config_from_mmproj)
    mmproj_projector = "qwen2.5vl_merger"
    mmproj_text_architecture = "qwen2vl"
    config_class = Qwen25VLConfig

    @classmethod
    def vision_fields(cls, vision: dict, base, where: str) -> dict:
        return dict(window_size=int(vision.get("window_size", 112)),
                    fullatt_blocks=tuple(int(i) for i in vision.get("fullatt_block_indexes", (7, 15, 23, 31))))

    @classmethod
    def mmproj_fields(cls, mm) -> dict:
        pattern = int(mm.key("vision.n_wa_pattern", required=True))
        layers = int(mm.key("vision.block_count", required=True))
        # (clip.cpp reads no window for this projector: every released Qwen2.5-VL's is 112 pixels)
        return dict(fullatt_blocks=tuple(i for i in range(layers) if (i + 1) % pattern == 0),
                    window_size=int(mm.key("vision.window_size", 112)))

    @classmethod
    def vision_weights(cls, c: Qwen25VLConfig) -> dict[str, Weight]:
        dv, pre = c.vision_hidden, f"{TOWER}.merger"
        folded = dv * c.merge_size ** 2
        return {
            "patch_w": patch_weight(c),
            "merge_norm": vec(f"{pre}.ln_q.weight", dv, init="ones", gguf="v.post_ln.weight"),
            "merge_fc1": mat(f"{pre}.mlp.0.weight", folded, folded, gguf="mm.0.weight"),
            "merge_fc1_b": vec(f"{pre}.mlp.0.bias", folded, gguf="mm.0.bias"),
            "merge_fc2": mat(f"{pre}.mlp.2.weight", c.hidden_size, folded, gguf="mm.2.weight"),
            "merge_fc2_b": vec(f"{pre}.mlp.2.bias", c.hidden_size, gguf="mm.2.bias"),
        }

    @classmethod
    def vision_layer_weights(cls, c: Qwen25VLConfig, i: int) -> dict[str, Weight]:
        d, f, pre, gg = c.vision_hidden, c.vision_intermediate, f"{TOWER}.blocks.{i}", f"v.blk.{i}"
        out = {"ln1": vec(f"{pre}.norm1.weight", d, init="ones", gguf=f"{gg}.ln1.weight"),
               "ln2": vec(f"{pre}.norm2.weight", d, init="ones", gguf=f"{gg}.ln2.weight"),
               **attention_weights(pre, d, gg, split_qkv=True)}
        for name, n_out, n_in in (("gate", f, d), ("up", f, d), ("down", d, f)):
            out[name] = mat(f"{pre}.mlp.{name}_proj.weight", n_out, n_in, gguf=f"{gg}.ffn_{name}.weight")
            out[f"{name}_b"] = vec(f"{pre}.mlp.{name}_proj.bias", n_out, gguf=f"{gg}.ffn_{name}.bias")
        return out

    def encode_images(self, pixels):
        """uint8 (1, H, W, C) one image -> (H*W / (p*m)^2, D) embeddings, in the image's token order."""
        c: Qwen25VLConfig = self.config
        g = self.vision.weights()
        rows, cols = pixels.shape[1] // c.patch_size, pixels.shape[2] // c.patch_size
        h = self.patch_embeddings(pixels)  # (T, Dv)
        cos, sin, windows, whole = _tower_layout(rows, cols, c.merge_size, c.window_size // c.merge_size // c.patch_size,
                                                 c.vision_hidden // c.vision_heads, c.vision_rope_theta)
        for i, layer in enumerate(self.vision_layers):
            h = ops.rms_block(h, layer.weights(), c.vision_heads, c.vision_eps, c.vision_activation, jnp.asarray(cos),
                              jnp.asarray(sin), whole if i in c.fullatt_blocks else windows)
        x = rms_norm(h, g["merge_norm"], 1e-6).reshape(h.shape[0] // c.merge_size ** 2, -1)  # (tokens, Dv * m^2)
        x = ops.ACTIVATIONS["gelu"](ops.dense(x, g["merge_fc1"], g["merge_fc1_b"]))
        return ops.dense(x, g["merge_fc2"], g["merge_fc2_b"]).astype(self.dtype)  # (tokens, D)


@lru_cache(maxsize=32)
def _tower_layout(rows: int, cols: int, merge: int, window: int, head_dim: int, theta: float):
    """Static per image size: the patches' rotary tables (T, hd/2), window groups, the one whole group."""
    r, c = ops.merged_grid(rows, cols, merge)
    cos, sin = ops.axial_rope(r, c, head_dim, theta)
    return cos, sin, ops.window_groups(rows, cols, merge, window), np.arange(rows * cols)[None]
