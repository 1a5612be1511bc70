"""GPT-OSS (gpt-oss-20b / 120b): attention with q/k/v/o biases and a learned per-head softmax
sink, alternating sliding-window (even layers) and full layers, YaRN rotary; a top-k routed
mixture of experts whose router has a bias, whose k weights are a softmax over the chosen
logits, and whose experts have biases and a clamped SwiGLU ((up + 1) * gate * sigmoid(1.702 gate)).

HF: GptOssForCausalLM ("gpt_oss"; experts fused as (E, D, 2F) gate/up interleaved and (E, F, D),
in bfloat16 or as MXFP4 blocks + scales, dequantized at load). GGUF: `gpt-oss` (gate and up
split into ffn_gate_exps / ffn_up_exps; the pre-MLP norm is post_attention_norm).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import AttentionSpec
from ...ops.moe import Routing
from ...ops.norm import rms_norm
from ..parts.base import CausalLM
from ..parts.blocks import attention, attention_weights, norm
from ..parts.config_io import GGUFMeta, gguf_fields, hf_fields, hf_layer_types
from .gemma2 import alternating
from ..parts.moe import MoEConfig, expert_weights, router_weights, routed


@dataclass(frozen=True)
class GptOssConfig(MoEConfig):
    experts_mxfp4: bool = False  # the HF checkpoint holds the experts as MXFP4 blocks

    def attention_spec(self, layer: int) -> AttentionSpec:
        return AttentionSpec(scale=self.head_dim ** -0.5, window=self.sliding_window if self.is_sliding(layer) else None,
                             sinks=True)

    @property
    def routing(self) -> Routing:
        return Routing(self.num_experts, self.num_experts_per_tok, scoring="topk_softmax")


class GptOss(CausalLM):
    name = "gpt_oss"
    hf_architectures = ("GptOssForCausalLM",)
    gguf_architectures = ("gpt-oss",)
    config_class = GptOssConfig

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str):
        fields = hf_fields(cfg, where, cls.name)
        n = fields["num_layers"]
        quant = (cfg.get("quantization_config") or {}).get("quant_method")
        return GptOssConfig(**fields, qkv_bias=bool(cfg.get("attention_bias", True)),
                            o_bias=bool(cfg.get("attention_bias", True)),
                            sliding_window=int(cfg.get("sliding_window") or 128),
                            layer_types=hf_layer_types(cfg, n) or alternating(n, 2),
                            num_experts=int(cfg.get("num_local_experts") or cfg["num_experts"]),
                            num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                            moe_intermediate_size=fields["intermediate_size"], activation="swiglu_oai",
                            experts_mxfp4=quant == "mxfp4")

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str):
        fields = gguf_fields(meta, cls.name)
        n = fields["num_layers"]
        return GptOssConfig(**fields, qkv_bias=True, o_bias=True, sliding_window=int(meta.key("attention.sliding_window", 128)),
                            layer_types=alternating(n, 2), num_experts=int(meta.key("expert_count", required=True)),
                            num_experts_per_tok=int(meta.key("expert_used_count", required=True)),
                            moe_intermediate_size=int(meta.key("expert_feed_forward_length", required=True)),
                            activation="swiglu_oai")

    @classmethod
    def layer_weights(cls, c: GptOssConfig, i: int):
        hf, gg, d = f"model.layers.{i}", f"blk.{i}", c.hidden_size
        experts = f"{hf}.mlp.experts"
        return {
            "attn_norm": norm(d, f"{hf}.input_layernorm.weight", f"{gg}.attn_norm.weight"),
            **attention_weights(c, hf=f"{hf}.self_attn", gguf=gg, sinks=True),
            "mlp_norm": norm(d, f"{hf}.post_attention_layernorm.weight", f"{gg}.post_attention_norm.weight"),
            **router_weights(c, f"{hf}.mlp.router", f"{gg}.ffn_gate_inp", bias=True),
            **expert_weights(c, hf_fused=(f"{experts}.gate_up_proj", f"{experts}.down_proj"), mxfp4=c.experts_mxfp4,
                             gguf=gg, biases=True),
        }

    def layer(self, i, x, w, cache, ctx):
        c = self.config
        h, cache = attention(c, i, rms_norm(x, w["attn_norm"], c.rms_norm_eps), w, cache, ctx)
        x = x + h
        return x + routed(self, rms_norm(x, w["mlp_norm"], c.rms_norm_eps), w), cache
