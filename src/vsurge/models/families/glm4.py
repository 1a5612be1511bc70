"""GLM-4 (GLM-4-9B-0414, GLM-Z1): q/k/v biases, a norm after attention and after the MLP as well
as before each, gate and up fused in one checkpoint tensor, half the head dims rotary and stored
in adjacent pairs (put in rotate-half order at load).

HF: Glm4ForCausalLM ("glm4"); GGUF: `glm4` (pairs kept as stored; llama.cpp rotates them so).
"""

from __future__ import annotations

from ...config import ModelConfig
from ...ops.norm import rms_norm
from ..parts.base import CausalLM
from ..parts.blocks import attention, attention_weights, mlp, mlp_weights, norm
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields, hf_rope_parameters, rope_from_hf


class Glm4(CausalLM):
    supports_lora = True  # (models/parts/base.py)
    name = "glm4"
    hf_architectures = ("Glm4ForCausalLM",)
    gguf_architectures = ("glm4",)

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str) -> ModelConfig:
        check_activation(cfg, where, ("silu", "swish"))
        fields = hf_fields(cfg, where, cls.name)
        params = {"partial_rotary_factor": 0.5, **hf_rope_parameters(cfg)}
        fields["rope"] = rope_from_hf(params, fields["head_dim"], where,
                                      max_position_embeddings=fields["max_position_embeddings"])
        return ModelConfig(**fields, qkv_bias=bool(cfg.get("attention_bias", True)))

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str) -> ModelConfig:
        return ModelConfig(**gguf_fields(meta, cls.name), qkv_bias=meta.has("blk.0.attn_q.bias"))

    @classmethod
    def layer_weights(cls, c: ModelConfig, i: int):
        hf, gg, d = f"model.layers.{i}", f"blk.{i}", c.hidden_size
        return {
            "attn_norm": norm(d, f"{hf}.input_layernorm.weight", f"{gg}.attn_norm.weight"),
            **attention_weights(c, hf=f"{hf}.self_attn", gguf=gg, interleaved_rotary=c.rope.dim or c.head_dim),
            "post_attn_norm": norm(d, f"{hf}.post_self_attn_layernorm.weight", f"{gg}.post_attention_norm.weight"),
            "mlp_norm": norm(d, f"{hf}.post_attention_layernorm.weight", f"{gg}.ffn_norm.weight"),
            **mlp_weights(d, c.intermediate_size, hf=f"{hf}.mlp", gguf=gg, hf_gate_up="gate_up_proj",
                          gguf_gate_up="ffn_up"),
            "post_mlp_norm": norm(d, f"{hf}.post_mlp_layernorm.weight", f"{gg}.post_ffw_norm.weight"),
        }

    def layer(self, i, x, w, cache, ctx):
        c = self.config
        h, cache = attention(c, i, rms_norm(x, w["attn_norm"], c.rms_norm_eps), w, cache, ctx)
        x = x + rms_norm(h, w["post_attn_norm"], c.rms_norm_eps)
        h = mlp(rms_norm(x, w["mlp_norm"], c.rms_norm_eps), w)
        return x + rms_norm(h, w["post_mlp_norm"], c.rms_norm_eps), cache
