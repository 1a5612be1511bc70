"""Granite 3.x (dense): Llama's layers with four multipliers: embeddings (embedding_multiplier),
each residual branch (residual_multiplier), attention scores (attention_multiplier instead of
1/sqrt(head_dim)) and the logits (divided by logits_scaling).

HF: GraniteForCausalLM ("granite"); GGUF: `granite` (q/k permuted as for `llama`; the
multipliers as embedding_scale, residual_scale, attention.scale, logit_scale).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import AttentionSpec, ModelConfig
from ...ops.norm import rms_norm
from ..parts.blocks import attention, mlp
from ..parts.config_io import GGUFMeta, gguf_fields
from .llama import Llama


@dataclass(frozen=True)
class GraniteConfig(ModelConfig):
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    logits_scaling: float = 1.0

    def attention_spec(self, layer: int) -> AttentionSpec:
        return AttentionSpec(scale=self.attention_multiplier,
                             window=self.sliding_window if self.is_sliding(layer) else None)


class Granite(Llama):
    name = "granite"
    hf_architectures = ("GraniteForCausalLM",)
    gguf_architectures = ("granite",)
    config_class = GraniteConfig

    @classmethod
    def hf_extra(cls, cfg: dict, fields: dict) -> dict:
        return {k: float(cfg.get(k, 1.0)) for k in
                ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")}

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str) -> ModelConfig:
        fields = gguf_fields(meta, cls.name)
        return GraniteConfig(**fields, qkv_bias=meta.has("blk.0.attn_q.bias"), o_bias=meta.has("blk.0.attn_output.bias"),
                             embedding_multiplier=float(meta.key("embedding_scale", 1.0)),
                             residual_multiplier=float(meta.key("residual_scale", 1.0)),
                             attention_multiplier=float(meta.key("attention.scale", fields["head_dim"] ** -0.5)),
                             logits_scaling=float(meta.key("logit_scale", 1.0)))

    @property
    def embed_scale(self) -> float:
        return self.config.embedding_multiplier

    def layer(self, i, x, w, cache, ctx):
        c = self.config
        h, cache = attention(c, i, rms_norm(x, w["attn_norm"], c.rms_norm_eps), w, cache, ctx)
        x = x + h * c.residual_multiplier
        return x + mlp(rms_norm(x, w["mlp_norm"], c.rms_norm_eps), w) * c.residual_multiplier, cache

    def scale_logits(self, logits):
        return logits / self.config.logits_scaling
