"""Cohere Command R7B / Command A (Cohere 2): one LayerNorm (no bias) feeding attention and the MLP
in parallel (x + attn(n) + mlp(n)), three sliding-window layers with RoPE to every global layer
without positions, rotary dims stored in adjacent pairs, tied embeddings, logits times
logit_scale.

HF: Cohere2ForCausalLM ("cohere2"); GGUF: `cohere2` (pairs kept as stored; llama.cpp rotates them
so).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import ModelConfig, Rope
from ...ops.norm import layer_norm
from ..parts.base import CausalLM
from ..parts.blocks import attention, attention_weights, mlp, mlp_weights, norm
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields, hf_layer_types
from .gemma2 import alternating

PATTERN = 4


@dataclass(frozen=True)
class Cohere2Config(ModelConfig):
    logit_scale: float = 1.0

    def layer_rope(self, layer: int) -> Rope | None:
        return self.rope if self.is_sliding(layer) else None  # global layers use no positions


class Cohere2(CausalLM):
    supports_lora = True  # (models/parts/base.py)
    name = "cohere2"
    hf_architectures = ("Cohere2ForCausalLM",)
    gguf_architectures = ("cohere2",)
    config_class = Cohere2Config

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str) -> ModelConfig:
        check_activation(cfg, where, ("silu", "swish"))
        fields = hf_fields(cfg, where, cls.name)
        fields["rms_norm_eps"] = float(cfg.get("layer_norm_eps", 1e-5))
        fields["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", True))
        n = fields["num_layers"]
        bias = bool(cfg.get("attention_bias", False))
        return Cohere2Config(**fields, qkv_bias=bias, o_bias=bias, sliding_window=int(cfg["sliding_window"]),
                             layer_types=hf_layer_types(cfg, n) or alternating(n, int(cfg.get("sliding_window_pattern",
                                                                                               PATTERN))),
                             logit_scale=float(cfg.get("logit_scale", 1.0)))

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str) -> ModelConfig:
        fields = gguf_fields(meta, cls.name)
        fields["rms_norm_eps"] = float(meta.key("attention.layer_norm_epsilon", 1e-5))
        return Cohere2Config(**fields, sliding_window=int(meta.key("attention.sliding_window", required=True)),
                             layer_types=alternating(fields["num_layers"], PATTERN),
                             logit_scale=float(meta.key("logit_scale", 1.0)))

    @classmethod
    def layer_weights(cls, c: ModelConfig, i: int):
        hf, gg, d = f"model.layers.{i}", f"blk.{i}", c.hidden_size
        rotary = c.rope.dim or c.head_dim
        return {
            "attn_norm": norm(d, f"{hf}.input_layernorm.weight", f"{gg}.attn_norm.weight"),
            **attention_weights(c, hf=f"{hf}.self_attn", gguf=gg, interleaved_rotary=rotary),
            **mlp_weights(d, c.intermediate_size, hf=f"{hf}.mlp", gguf=gg),
        }

    def layer(self, i, x, w, cache, ctx):
        c = self.config
        h = layer_norm(x, w["attn_norm"], c.rms_norm_eps)
        out, cache = attention(c, i, h, w, cache, ctx)
        return x + out + mlp(h, w), cache

    def decode_layers(self, hidden, positions, cache):
        """As the base class, with the final LayerNorm (not RMSNorm)."""
        out, cache = super().decode_layers(hidden, positions, cache, final_norm=False)
        return layer_norm(out, self.final_norm[...], self.config.rms_norm_eps), cache

    def scale_logits(self, logits):
        return logits * self.config.logit_scale
