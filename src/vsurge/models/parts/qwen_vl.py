"""What the Qwen vision-language families share (Qwen2.5-VL: qwen2_5_vl.py, Qwen3-VL: qwen3_vl.py): the
HF config's reading (a flat hub config or text_config + vision_config), images at their own size cut into
Conv3d patches in merge-block order, and the text model's 3-D rotary positions (M-RoPE).

M-RoPE: each position is (t, h, w); `mrope_section` says how many rotary frequencies turn with each, as
consecutive runs (Qwen2.5-VL) or interleaved t, h, w, t, h, w, ... (Qwen3-VL). Text tokens have t = h = w;
an image's tokens (offset, offset + row, offset + col); the text after an image continues from the
largest + 1 (multimodal/qwen2_vl.rope_index). The prompt's positions come with it (MultimodalPrompt.rope);
generated tokens are at position + rope_delta on every axis. The KV page slot of a token stays its index
in the sequence: only the rotary tables differ (rope_tables).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from ...errors import ModelLoadError, UnsupportedModelError
from ...ops import vision as ops
from ...ops.rope import rope_cos_sin
from .mmproj_config import activation, token_id, tower_fields
from .spec import Joined, Tensor, Weight, tensor
from .vision_lm import VisionConfig, VisionLM

TOWER = "visual"


@dataclass(frozen=True)
class QwenVLConfig(VisionConfig):
    patch_size: int = 14
    merge_size: int = 2  # patches per side one image token folds
    temporal_patch_size: int = 2  # frames a patch spans (a still image: repeated)
    vision_rope_theta: float = 10000.0
    mrope_section: tuple[int, ...] = (16, 24, 24)  # rotary frequencies turned by t, h, w
    mrope_interleaved: bool = False  # t, h, w, t, h, w, ... (Qwen3-VL) instead of runs
    vision_start_token_id: int = -1


def _piece(name: str, n_out: int, rest: tuple[int, ...], part: int | None = None, parts: int = 1) -> Tensor:
    """A stored (n_out * parts, *rest) tensor, or its part-th slice of n_out rows."""
    rows = None if part is None else (part * n_out, (part + 1) * n_out)
    return tensor(name, (n_out * parts, *rest), rows=rows)


def vec(name: str, n: int, init: str = "zeros", part: int | None = None, parts: int = 1,
        gguf: str | None = None) -> Weight:
    """(n,); part: which of `parts` equal slices of a fused vector it is (the qkv bias); gguf: llama.cpp's
    mmproj name of the same vector."""
    return Weight((n,), (None,), _piece(name, n, (), part, parts), gguf and _piece(gguf, n, (), part, parts),
                  init=init)


def mat(name: str, n_out: int, n_in: int, part: int | None = None, parts: int = 1, gguf: str | None = None) -> Weight:
    """HF (out, in) -> (in, out); part: which of `parts` equal output slices of a fused matrix it is (qkv)."""
    return Weight((n_in, n_out), (None, None), _piece(name, n_out, (n_in,), part, parts),
                  gguf and _piece(gguf, n_out, (n_in,), part, parts))


def attention_weights(pre: str, d: int, gguf: str | None = None, split_qkv: bool = False) -> dict[str, Weight]:
    """A tower block's fused qkv (read as wq/wk/wv and biases) and output projection; gguf: the block's
    mmproj prefix (None: no mmproj form), whose qkv the converter stores fused or, split_qkv, as attn_q / attn_k /
    attn_v."""
    def at(leaf: str) -> str | None:
        return gguf and f"{gguf}.{leaf}"

    out = {"wo": mat(f"{pre}.attn.proj.weight", d, d, gguf=at("attn_out.weight")),
           "bo": vec(f"{pre}.attn.proj.bias", d, gguf=at("attn_out.bias"))}
    for j, part in enumerate("qkv"):
        w, b = f"{pre}.attn.qkv.weight", f"{pre}.attn.qkv.bias"
        if split_qkv:
            out[f"w{part}"] = Weight((d, d), (None, None), _piece(w, d, (d,), j, 3),
                                     gguf and _piece(at(f"attn_{part}.weight"), d, (d,)))
            out[f"b{part}"] = Weight((d,), (None,), _piece(b, d, (), j, 3),
                                     gguf and _piece(at(f"attn_{part}.bias"), d, ()), init="zeros")
        else:
            out[f"w{part}"] = mat(w, d, d, part=j, parts=3, gguf=at("attn_qkv.weight"))
            out[f"b{part}"] = vec(b, d, part=j, parts=3, gguf=at("attn_qkv.bias"))
    return out


def patch_weight(c) -> Weight:
    """The Conv3d patch kernel (Dv, C, frames, p, p); llama.cpp's converter stores one (Dv, C, p, p) kernel per
    frame (v.patch_embd.weight, v.patch_embd.weight.1)."""
    dv, p, t = c.vision_hidden, c.patch_size, c.temporal_patch_size
    frames = tuple(tensor("v.patch_embd.weight" + (f".{k}" if k else ""), (dv, 3, p, p), matrix=False)
                   for k in range(t))
    return Weight((dv, 3, t, p, p), (None,) * 5,
                  tensor(f"{TOWER}.patch_embed.proj.weight", (dv, 3, t, p, p), matrix=False), Joined(frames, axis=2))


def merged_tokens(h, w: dict, merge: int, post_shuffle: bool = False):
    """(T, Dv) patches in merge-block order -> (T / m^2, D): each block's patches LayerNormed (each patch, or
    their concatenation: post_shuffle), concatenated, through the two-layer GELU MLP. w: norm, norm_b, fc1,
    fc1_b, fc2, fc2_b (Qwen2-VL's and Qwen3-VL's mergers)."""
    tokens = h.shape[0] // merge ** 2
    if post_shuffle:
        x = ops.layer_norm(h.reshape(tokens, -1), w["norm"], w["norm_b"], 1e-6)
    else:
        x = ops.layer_norm(h, w["norm"], w["norm_b"], 1e-6).reshape(tokens, -1)
    x = ops.ACTIVATIONS["gelu"](ops.dense(x, w["fc1"], w["fc1_b"]))
    return ops.dense(x, w["fc2"], w["fc2_b"])


def mrope_axes(section: tuple[int, ...], interleaved: bool) -> np.ndarray:
    """(rotary/2,) which of t, h, w (0, 1, 2) each rotary frequency turns with."""
    if not interleaved:
        return np.repeat(np.arange(3), section)
    axes = np.zeros(sum(section), np.int64)
    for axis in (1, 2):
        axes[axis:section[axis] * 3:3] = axis
    return axes


class QwenVisionLM(VisionLM):
    """Mixin before the text family (class Qwen25VL(QwenVisionLM, Qwen2))."""

    hf_renames = (("model.language_model.", "model."), ("model.visual.", "visual."))

    @classmethod
    def vision_fields(cls, vision: dict, base, where: str) -> dict:
        """The family's own config fields from config.json's vision_config (over the common ones)."""
        return {}

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str):
        vision = dict(cfg.get("vision_config") or {})
        text = dict(cfg.get("text_config") or {k: v for k, v in cfg.items() if k != "vision_config"})
        text.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
        text["_name_or_path"] = cfg.get("_name_or_path", "")
        rope = dict(text.get("rope_parameters") or {}) | dict(text.get("rope_scaling") or {})
        section = tuple(int(s) for s in rope.pop("mrope_section", (16, 24, 24)))
        interleaved = bool(rope.pop("mrope_interleaved", cls.config_class.mrope_interleaved))
        if rope.get("type") == "mrope" or rope.get("rope_type") == "mrope":  # (the hub's spelling of default)
            rope.pop("type", None)
            rope["rope_type"] = "default"
        text["rope_parameters"], text["rope_scaling"] = rope, None
        base = super().config_from_hf(text, where)
        if sum(section) * 2 != (base.rope.dim or base.head_dim):
            raise UnsupportedModelError(f"{where}: mrope_section {section} does not cover the {base.head_dim}-dim heads")
        activation = vision.get("hidden_act", "silu")
        if activation not in ops.ACTIVATIONS:
            raise UnsupportedModelError(f"{where}: vision hidden_act {activation!r} is not supported")
        if int(vision.get("out_hidden_size", base.hidden_size)) != base.hidden_size:
            raise UnsupportedModelError(f"{where}: the merger's out_hidden_size is not the text model's width")
        fields = dict(
            image_token_id=int(cfg.get("image_token_id", 151655)),
            vision_start_token_id=int(cfg.get("vision_start_token_id", 151652)), variable_images=True,
            vision_hidden=int(vision.get("hidden_size", 1280)), vision_layers=int(vision.get("depth", 32)),
            vision_heads=int(vision.get("num_heads", 16)), vision_intermediate=int(vision.get("intermediate_size", 3420)),
            vision_eps=1e-6, vision_activation=activation, patch_size=int(vision.get("patch_size", 14)),
            merge_size=int(vision.get("spatial_merge_size", 2)), temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
            vision_rope_theta=float((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            mrope_section=section, mrope_interleaved=interleaved)
        return dataclasses.replace(base, **{**fields, **cls.vision_fields(vision, base, where)})

    @classmethod
    def mmproj_fields(cls, mm) -> dict:
        """The family's own config fields from its mmproj's clip.vision.* keys."""
        return {}

    @classmethod
    def config_from_mmproj(cls, text, mm, where: str):
        """The text GGUF (a `qwen2vl` / `qwen3vl` one: its M-RoPE sections as rope.dimension_sections, the
        interleaving implied by the architecture, as llama.cpp reads it) and the mmproj's tower."""
        base = cls.config_from_gguf(text, text.where)  # the text family's reading, as this family's config
        section = tuple(int(s) for s in (text.key("rope.dimension_sections", required=True))[:3])
        if sum(section) * 2 != (base.rope.dim or base.head_dim):
            raise ModelLoadError(f"{text.where}: rope.dimension_sections {section} do not cover the "
                                 f"{base.head_dim}-dim heads")
        return dataclasses.replace(
            base, **tower_fields(mm, base.hidden_size), vision_activation=activation(mm), variable_images=True,
            patch_size=int(mm.key("vision.patch_size", required=True)),
            merge_size=int(mm.key("vision.spatial_merge_size", 2)), temporal_patch_size=2,
            image_token_id=token_id(text, "<|image_pad|>", where),
            vision_start_token_id=token_id(text, "<|vision_start|>", where), mrope_section=section,
            **cls.mmproj_fields(mm))

    @classmethod
    def mmproj_preprocessor(cls, mm) -> dict:
        # clip.cpp's limits for every Qwen-VL (8 to 4096 image tokens), not the hub processor's
        block = (int(mm.key("vision.patch_size", required=True)) * int(mm.key("vision.spatial_merge_size", 2))) ** 2
        return {"min_pixels": 8 * block, "max_pixels": 4096 * block}

    def vision_patches(self, pixels):
        """uint8 (1, H, W, C) one image -> (H/p * W/p, C * frames * p * p) float32 normalized patches in
        merge-block order (HF's pixel_values of the image)."""
        c = self.config
        x = ops.normalize_pixels(pixels, c.image_mean, c.image_std, c.rescale_factor)[0]  # (C, H, W)
        return ops.merged_patches(x, c.patch_size, c.merge_size, c.temporal_patch_size)

    def patch_embeddings(self, pixels, bias=None):
        """uint8 (1, H, W, C) -> (T, Dv) the Conv3d patch embedding (a matmul on flattened patches)."""
        kernel = self.vision.weights()["patch_w"]  # (Dv, C, frames, p, p)
        return ops.dense(self.vision_patches(pixels), kernel.reshape(kernel.shape[0], -1).T, bias)

    def rope_tables(self, positions) -> dict:
        """positions (B, T) (text only: t = h = w) or (3, B, T) -> {rope: (cos, sin) (B, T, rotary/2)}, each
        frequency taken from its axis (mrope_axes)."""
        c = self.config
        if positions.ndim == 2:
            positions = jnp.broadcast_to(positions[None], (3, *positions.shape))
        _, b, t = positions.shape
        axes = jnp.asarray(mrope_axes(c.mrope_section, c.mrope_interleaved))
        half = jnp.arange(axes.shape[0])
        cos, sin = rope_cos_sin(positions.reshape(3 * b, t), c.rope, c.head_dim)  # (3B, T, rotary/2)
        pick = [y.reshape(3, b, t, -1)[axes, :, :, half].transpose(1, 2, 0) for y in (cos, sin)]
        return {c.rope: tuple(pick)}
