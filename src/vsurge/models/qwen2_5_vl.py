"""Qwen2.5-VL (3B, 7B, 32B, 72B): images at their own resolution through a window-attention ViT, a Qwen2
text model whose rotary positions are 3-D (M-RoPE).

The tower: an image resized to whole 2 x 2 blocks of 14-pixel patches (multimodal/qwen2_vl.py), each
patch repeated to 2 frames and embedded by a Conv3d (a matmul on flattened patches), RMSNorm blocks with
SwiGLU MLPs and 2-D rotary q/k (a patch's row turns half the frequencies, its column the rest), attending
within windows of `window_size` pixels except in the `fullatt_block_indexes` blocks (whole image); the
merger folds each 2 x 2 block into one token at the text model's width.

M-RoPE: each position is (t, h, w); `mrope_section` says how many rotary frequencies turn with each. Text
tokens have t = h = w; an image's tokens (offset, offset + row, offset + col); the text after an image
continues from the largest + 1 (multimodal/qwen2_vl.rope_index). The prompt's positions come with it
(MultimodalPrompt.rope); generated tokens are at position + rope_delta on every axis. The KV page slot of
a token stays its index in the sequence: only the rotary tables differ (rope_tables).

HF: Qwen2_5_VLForConditionalGeneration (model_type "qwen2_5_vl"): the text model under model. (the hub's
layout) or model.language_model., the tower under visual. or model.visual.; config.json flat (the hub's)
or with text_config (transformers 5).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import jax.numpy as jnp
import numpy as np

from ..errors import UnsupportedModelError
from ..ops import vision as ops
from ..ops.norm import rms_norm
from ..ops.rope import rope_cos_sin
from .qwen2 import Qwen2
from .spec import Weight, tensor
from .vision_lm import VisionConfig, VisionLM

TOWER = "visual"


@dataclass(frozen=True)
class Qwen25VLConfig(VisionConfig):
    patch_size: int = 14
    merge_size: int = 2  # patches per side one image token folds
    temporal_patch_size: int = 2  # frames a patch spans (a still image: repeated)
    window_size: int = 112  # pixels per side of an attention window
    fullatt_blocks: tuple[int, ...] = ()  # tower blocks that attend to the whole image
    vision_rope_theta: float = 10000.0
    mrope_section: tuple[int, ...] = (16, 24, 24)  # rotary frequencies turned by t, h, w
    vision_start_token_id: int = -1


def _vec(name: str, n: int, init: str = "zeros", part: int | None = None, parts: int = 1) -> Weight:
    """(n,); part: which of `parts` equal slices of a fused vector it is (the qkv bias)."""
    rows = None if part is None else (part * n, (part + 1) * n)
    return Weight((n,), (None,), tensor(name, (n * parts,), rows=rows), init=init)


def _mat(name: str, n_out: int, n_in: int, part: int | None = None, parts: int = 1) -> Weight:
    """HF (out, in) -> (in, out); part: which of `parts` equal output slices of a fused matrix it is (qkv)."""
    rows = None if part is None else (part * n_out, (part + 1) * n_out)
    return Weight((n_in, n_out), (None, None), tensor(name, (n_out * parts, n_in), rows=rows))


class Qwen25VL(VisionLM, Qwen2):
    supports_lora = False  # (adapters name model.language_model's projections: not laid out yet)
    name = "qwen2_5_vl"
    hf_model_types = ("qwen2_5_vl",)
    hf_architectures = ("Qwen2_5_VLForConditionalGeneration",)
    gguf_architectures = ()
    config_class = Qwen25VLConfig
    hf_renames = (("model.language_model.", "model."), ("model.visual.", "visual."))

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str):
        vision = dict(cfg.get("vision_config") or {})
        text = dict(cfg.get("text_config") or {k: v for k, v in cfg.items() if k != "vision_config"})
        text.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
        text["_name_or_path"] = cfg.get("_name_or_path", "")
        rope = dict(text.get("rope_parameters") or {}) | dict(text.get("rope_scaling") or {})
        section = tuple(int(s) for s in rope.pop("mrope_section", (16, 24, 24)))
        if rope.get("type") == "mrope" or rope.get("rope_type") == "mrope":  # (the hub's spelling of default)
            rope.pop("type", None)
            rope["rope_type"] = "default"
        text["rope_parameters"], text["rope_scaling"] = rope, None
        base = super().config_from_hf(text, where)
        if sum(section) * 2 != (base.rope.dim or base.head_dim):
            raise UnsupportedModelError(f"{where}: mrope_section {section} does not cover the {base.head_dim}-dim heads")
        if vision.get("hidden_act", "silu") not in ops.ACTIVATIONS:
            raise UnsupportedModelError(f"{where}: vision hidden_act {vision.get('hidden_act')!r} is not supported")
        if int(vision.get("out_hidden_size", base.hidden_size)) != base.hidden_size:
            raise UnsupportedModelError(f"{where}: the merger's out_hidden_size is not the text model's width")
        vrope = vision.get("rope_parameters") or {}
        return dataclasses.replace(
            base, image_token_id=int(cfg.get("image_token_id", 151655)),
            vision_start_token_id=int(cfg.get("vision_start_token_id", 151652)), variable_images=True,
            vision_hidden=int(vision.get("hidden_size", 1280)), vision_layers=int(vision.get("depth", 32)),
            vision_heads=int(vision.get("num_heads", 16)), vision_intermediate=int(vision.get("intermediate_size", 3420)),
            vision_eps=1e-6, vision_activation=vision.get("hidden_act", "silu"),
            patch_size=int(vision.get("patch_size", 14)), merge_size=int(vision.get("spatial_merge_size", 2)),
            temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
            window_size=int(vision.get("window_size", 112)),
            fullatt_blocks=tuple(int(i) for i in vision.get("fullatt_block_indexes", (7, 15, 23, 31))),
            vision_rope_theta=float(vrope.get("rope_theta", 10000.0)), mrope_section=section)

    # ---------------------------------------------------------------- the tower's weights
    @classmethod
    def vision_weights(cls, c: Qwen25VLConfig) -> dict[str, Weight]:
        dv, p, t = c.vision_hidden, c.patch_size, c.temporal_patch_size
        folded = dv * c.merge_size ** 2
        pre = f"{TOWER}.merger"
        return {
            "patch_w": Weight((dv, 3, t, p, p), (None,) * 5,
                              tensor(f"{TOWER}.patch_embed.proj.weight", (dv, 3, t, p, p), matrix=False)),
            "merge_norm": _vec(f"{pre}.ln_q.weight", dv, init="ones"),
            "merge_fc1": _mat(f"{pre}.mlp.0.weight", folded, folded), "merge_fc1_b": _vec(f"{pre}.mlp.0.bias", folded),
            "merge_fc2": _mat(f"{pre}.mlp.2.weight", c.hidden_size, folded),
            "merge_fc2_b": _vec(f"{pre}.mlp.2.bias", c.hidden_size),
        }

    @classmethod
    def vision_layer_weights(cls, c: Qwen25VLConfig, i: int) -> dict[str, Weight]:
        d, f, pre = c.vision_hidden, c.vision_intermediate, f"{TOWER}.blocks.{i}"
        out = {"ln1": _vec(f"{pre}.norm1.weight", d, init="ones"), "ln2": _vec(f"{pre}.norm2.weight", d, init="ones"),
               "wo": _mat(f"{pre}.attn.proj.weight", d, d), "bo": _vec(f"{pre}.attn.proj.bias", d)}
        for j, part in enumerate("qkv"):  # the fused qkv projection, read as three
            out[f"w{part}"] = _mat(f"{pre}.attn.qkv.weight", d, d, part=j, parts=3)
            out[f"b{part}"] = _vec(f"{pre}.attn.qkv.bias", d, part=j, parts=3)
        for name, n_out, n_in in (("gate", f, d), ("up", f, d), ("down", d, f)):
            out[name] = _mat(f"{pre}.mlp.{name}_proj.weight", n_out, n_in)
            out[f"{name}_b"] = _vec(f"{pre}.mlp.{name}_proj.bias", n_out)
        return out

    # ---------------------------------------------------------------- the tower
    def vision_patches(self, pixels):
        """uint8 (1, H, W, C) one image -> (H/p * W/p, C * frames * p * p) float32 normalized patches in
        merge-block order (HF's pixel_values of the image)."""
        c: Qwen25VLConfig = self.config
        x = ops.normalize_pixels(pixels, c.image_mean, c.image_std, c.rescale_factor)[0]  # (C, H, W)
        return ops.merged_patches(x, c.patch_size, c.merge_size, c.temporal_patch_size)

    def encode_images(self, pixels):
        """uint8 (1, H, W, C) one image -> (H*W / (p*m)^2, D) embeddings, in the image's token order."""
        c: Qwen25VLConfig = self.config
        g = self.vision.weights()
        rows, cols = pixels.shape[1] // c.patch_size, pixels.shape[2] // c.patch_size
        kernel = g["patch_w"]
        h = ops.dense(self.vision_patches(pixels), kernel.reshape(kernel.shape[0], -1).T)  # (T, Dv) the Conv3d
        cos, sin, windows, whole = _tower_layout(rows, cols, c.merge_size, c.window_size // c.merge_size // c.patch_size,
                                                 c.vision_hidden // c.vision_heads, c.vision_rope_theta)
        act = ops.ACTIVATIONS[c.vision_activation]
        for i, layer in enumerate(self.vision_layers):
            w = layer.weights()
            groups = whole if i in c.fullatt_blocks else windows
            h = h + ops.grouped_attention(rms_norm(h, w["ln1"], c.vision_eps), w, c.vision_heads, jnp.asarray(cos),
                                          jnp.asarray(sin), groups)
            x = rms_norm(h, w["ln2"], c.vision_eps)
            h = h + ops.dense(act(ops.dense(x, w["gate"], w["gate_b"])) * ops.dense(x, w["up"], w["up_b"]),
                              w["down"], w["down_b"])
        x = rms_norm(h, g["merge_norm"], 1e-6).reshape(h.shape[0] // c.merge_size ** 2, -1)  # (tokens, Dv * m^2)
        x = ops.ACTIVATIONS["gelu"](ops.dense(x, g["merge_fc1"], g["merge_fc1_b"]))
        return ops.dense(x, g["merge_fc2"], g["merge_fc2_b"]).astype(self.dtype)  # (tokens, D)

    # ---------------------------------------------------------------- M-RoPE
    def rope_tables(self, positions) -> dict:
        """positions (B, T) (text only: t = h = w) or (3, B, T) -> {rope: (cos, sin) (B, T, rotary/2)}, each
        frequency taken from the axis `mrope_section` gives it."""
        c: Qwen25VLConfig = self.config
        if positions.ndim == 2:
            positions = jnp.broadcast_to(positions[None], (3, *positions.shape))
        _, b, t = positions.shape
        axis = jnp.asarray(np.repeat(np.arange(3), c.mrope_section))  # (rotary/2,) the axis of each frequency
        half = jnp.arange(axis.shape[0])
        cos, sin = rope_cos_sin(positions.reshape(3 * b, t), c.rope, c.head_dim)  # (3B, T, rotary/2)
        pick = [y.reshape(3, b, t, -1)[axis, :, :, half].transpose(1, 2, 0) for y in (cos, sin)]
        return {c.rope: tuple(pick)}


@lru_cache(maxsize=32)
def _tower_layout(rows: int, cols: int, merge: int, window: int, head_dim: int, theta: float):
    """Static per image size: the patches' rotary tables (T, hd/2), window groups, the one whole group."""
    r, c = ops.merged_grid(rows, cols, merge)
    cos, sin = ops.axial_rope(r, c, head_dim, theta)
    return cos, sin, ops.window_groups(rows, cols, merge, window), np.arange(rows * cols)[None]
