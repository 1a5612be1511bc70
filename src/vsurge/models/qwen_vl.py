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

from ..errors import UnsupportedModelError
from ..ops import vision as ops
from ..ops.rope import rope_cos_sin
from .spec import Weight, tensor
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


def vec(name: str, n: int, init: str = "zeros", part: int | None = None, parts: int = 1) -> Weight:
    """(n,); part: which of `parts` equal slices of a fused vector it is (the qkv bias)."""
    rows = None if part is None else (part * n, (part + 1) * n)
    return Weight((n,), (None,), tensor(name, (n * parts,), rows=rows), init=init)


def mat(name: str, n_out: int, n_in: int, part: int | None = None, parts: int = 1) -> Weight:
    """HF (out, in) -> (in, out); part: which of `parts` equal output slices of a fused matrix it is (qkv)."""
    rows = None if part is None else (part * n_out, (part + 1) * n_out)
    return Weight((n_in, n_out), (None, None), tensor(name, (n_out * parts, n_in), rows=rows))


def attention_weights(pre: str, d: int) -> dict[str, Weight]:
    """A tower block's fused qkv (read as wq/wk/wv and biases) and output projection."""
    out = {"wo": mat(f"{pre}.attn.proj.weight", d, d), "bo": vec(f"{pre}.attn.proj.bias", d)}
    for j, part in enumerate("qkv"):
        out[f"w{part}"] = mat(f"{pre}.attn.qkv.weight", d, d, part=j, parts=3)
        out[f"b{part}"] = vec(f"{pre}.attn.qkv.bias", d, part=j, parts=3)
    return out


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
        """The family's own config fields from config.json's vision_config."""
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
        return dataclasses.replace(
            base, image_token_id=int(cfg.get("image_token_id", 151655)),
            vision_start_token_id=int(cfg.get("vision_start_token_id", 151652)), variable_images=True,
            vision_hidden=int(vision.get("hidden_size", 1280)), vision_layers=int(vision.get("depth", 32)),
            vision_heads=int(vision.get("num_heads", 16)), vision_intermediate=int(vision.get("intermediate_size", 3420)),
            vision_eps=1e-6, vision_activation=activation, patch_size=int(vision.get("patch_size", 14)),
            merge_size=int(vision.get("spatial_merge_size", 2)), temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
            vision_rope_theta=float((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            mrope_section=section, mrope_interleaved=interleaved, **cls.vision_fields(vision, base, where))

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
