"""Qwen3.5 and Qwen3.5-MoE with images: Qwen3-VL's tower and merger (qwen3_vl.py: LayerNorm ViT over the
whole image, learned positions beside the 2-D rotary) without deepstack, before the Qwen3-Next hybrid text
model (qwen3_next.py: Gated DeltaNet on three layers in four, gated full attention with partial rotary on
the rest), whose full-attention layers take interleaved M-RoPE positions over their rotary dimensions.
The DeltaNet layers see image tokens as any others: their states run over the image in order.

HF: Qwen3_5ForConditionalGeneration ("qwen3_5"), Qwen3_5MoeForConditionalGeneration ("qwen3_5_moe"):
model.language_model., model.visual. (the multi-token-prediction head is not read).
"""

from __future__ import annotations

from dataclasses import dataclass

from .qwen3_next import Qwen3Next, Qwen3NextConfig
from .qwen3_vl import Qwen3VisionTower, Qwen3VLConfig


@dataclass(frozen=True)
class Qwen35VLConfig(Qwen3VLConfig, Qwen3NextConfig):
    pass


class Qwen35VL(Qwen3VisionTower, Qwen3Next):
    name = "qwen3_5_vl"
    hf_model_types = ("qwen3_5", "qwen3_5_moe")
    hf_architectures = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
    gguf_architectures = ()  # (a text GGUF alone is Qwen3.5's text model; with its mmproj: config_from_mmproj)
    mmproj_text_architecture = "qwen35"
    mmproj_other_text_architectures = ("qwen35moe",)
    config_class = Qwen35VLConfig

    @classmethod
    def vision_fields(cls, vision: dict, base, where: str) -> dict:
        return {**super().vision_fields(vision, base, where), "deepstack_blocks": (), "feature_levels": 1}
