"""Ministral 3 / Mistral 3 text: Mistral's layers with YaRN and a query temperature that grows
with position (1 + beta * log(1 + floor(pos / original context)), Llama 4's attention scaling).

HF: Ministral3ForCausalLM ("ministral3"); GGUF: `mistral3` (beta as attention.temperature_scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp

from ...config import ModelConfig
from ...ops.norm import rms_norm
from ..parts.blocks import attention, mlp
from ..parts.config_io import GGUFMeta, gguf_fields, hf_rope_parameters
from .llama import Llama


@dataclass(frozen=True)
class Ministral3Config(ModelConfig):
    temperature_beta: float = 0.0  # 0: no query scaling
    temperature_length: int = 1  # positions per step of the log


class Ministral3(Llama):
    name = "ministral3"
    hf_architectures = ("Ministral3ForCausalLM",)
    gguf_architectures = ("mistral3",)
    config_class = Ministral3Config
    gguf_permuted_qk = True

    @classmethod
    def hf_extra(cls, cfg: dict, fields: dict) -> dict:
        params = hf_rope_parameters(cfg)
        window = cfg.get("sliding_window")
        return {"sliding_window": int(window) if window else None,
                "temperature_beta": float(params.get("llama_4_scaling_beta") or 0.0),
                "temperature_length": int(params.get("original_max_position_embeddings") or 1)}

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str) -> ModelConfig:
        fields = gguf_fields(meta, cls.name)
        # (the family's config class: Mistral 3's pair reads its text half here)
        return cls.config_class(**fields, temperature_beta=float(meta.key("attention.temperature_scale", 0.0) or 0.0),
                                temperature_length=int(fields["rope"].original_max_position_embeddings or 1))

    def layer(self, i, x, w, cache, ctx):
        c = self.config
        scale = None
        if c.temperature_beta:
            steps = jnp.floor(ctx.positions.astype(jnp.float32) / c.temperature_length)
            scale = 1 + c.temperature_beta * jnp.log1p(steps)
        h, cache = attention(c, i, rms_norm(x, w["attn_norm"], c.rms_norm_eps), w, cache, ctx, query_scale=scale)
        x = x + h
        return x + mlp(rms_norm(x, w["mlp_norm"], c.rms_norm_eps), w), cache
