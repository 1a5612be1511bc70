"""Phi-3 / Phi-3.5 / Phi-4 (dense): Llama's layers with q/k/v fused in one checkpoint tensor
(qkv_proj) and gate/up in another (gate_up_proj, gate rows first), partial rotary
(Phi-4-mini), LongRoPE per-frequency factors and a sliding window on every layer when set.

LongRoPE: the long factors apply when the serving context exceeds the original one (as
llama.cpp and vLLM choose; `config_for_context`), the short ones otherwise. HF:
Phi3ForCausalLM ("phi3"); GGUF: `phi3` (factors as rope_factors_long/short.weight).
"""

from __future__ import annotations

import dataclasses

from ...config import ModelConfig, Rope
from ..parts.base import CausalLM
from ..parts.blocks import attention_weights, mlp_weights, norm, pre_norm_layer
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields, hf_rope_parameters, rope_from_hf

LONG, SHORT = "rope_factors_long.weight", "rope_factors_short.weight"


class Phi3(CausalLM):
    supports_lora = True  # (models/parts/base.py)
    name = "phi3"
    hf_architectures = ("Phi3ForCausalLM",)
    gguf_architectures = ("phi3",)
    gguf_config_tensors = (LONG, SHORT)

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str) -> ModelConfig:
        check_activation(cfg, where, ("silu", "swish"))
        params = hf_rope_parameters(cfg)
        if params.get("rope_type", params.get("type")) in ("su", "yarn"):  # Phi-3's older names of longrope
            params["rope_type"] = "longrope"
        params.setdefault("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
        fields = hf_fields(cfg, where, cls.name)
        fields["rope"] = rope_from_hf(params, fields["head_dim"], where,
                                      max_position_embeddings=fields["max_position_embeddings"])
        window = cfg.get("sliding_window")
        return ModelConfig(**fields, sliding_window=int(window) if window else None)

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str) -> ModelConfig:
        fields = gguf_fields(meta, cls.name)
        rope = fields["rope"]
        if meta.has(LONG):
            original = int(meta.key("rope.scaling.original_context_length", required=True))
            rope = dataclasses.replace(
                rope, kind="longrope", original_max_position_embeddings=original,
                factor=fields["max_position_embeddings"] / original,
                attention_factor=meta.key("rope.scaling.attn_factor"),
                long_factor=tuple(float(x) for x in meta.read(LONG).reshape(-1)),
                short_factor=tuple(float(x) for x in meta.read(SHORT).reshape(-1)))
        window = meta.key("attention.sliding_window")
        return ModelConfig(**{**fields, "rope": rope}, sliding_window=int(window) if window else None)

    @classmethod
    def config_for_context(cls, config: ModelConfig, max_length: int) -> ModelConfig:
        rope: Rope = config.rope
        if rope.kind != "longrope":
            return config
        long = max_length > (rope.original_max_position_embeddings or max_length)
        return config.replace(rope=dataclasses.replace(rope, use_long_factor=long))

    @classmethod
    def layer_weights(cls, c: ModelConfig, i: int):
        hf, gg, d = f"model.layers.{i}", f"blk.{i}", c.hidden_size
        return {
            "attn_norm": norm(d, f"{hf}.input_layernorm.weight", f"{gg}.attn_norm.weight"),
            **attention_weights(c, hf=f"{hf}.self_attn", gguf=gg, hf_qkv="qkv_proj", gguf_qkv="attn_qkv"),
            "mlp_norm": norm(d, f"{hf}.post_attention_layernorm.weight", f"{gg}.ffn_norm.weight"),
            **mlp_weights(d, c.intermediate_size, hf=f"{hf}.mlp", gguf=gg, hf_gate_up="gate_up_proj",
                          gguf_gate_up="ffn_up"),
        }

    def layer(self, i, x, w, cache, ctx):
        return pre_norm_layer(self.config, i, x, w, cache, ctx)
