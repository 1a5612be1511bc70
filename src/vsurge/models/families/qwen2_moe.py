"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention with a routed mixture of experts
plus one shared expert scaled by a sigmoid gate; layers listed in `mlp_only_layers` (or off the
`decoder_sparse_step`) keep a dense MLP. Routing: softmax, top-k, renormalized only with
`norm_topk_prob`.

HF: Qwen2MoeForCausalLM ("qwen2_moe"); GGUF: `qwen2moe` (shared expert as *_shexp and
ffn_gate_inp_shexp).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ops.norm import rms_norm
from ..parts.base import CausalLM
from ..parts.blocks import attention, attention_weights, mlp, mlp_weights, norm
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields
from ..parts.moe import MoEConfig, qwen_moe_weights, routed_and_shared


@dataclass(frozen=True)
class Qwen2MoeConfig(MoEConfig):
    shared_expert_gate: bool = True


def moe_layer_flags(cfg: dict, n: int) -> tuple[bool, ...]:
    """HF Qwen-MoE: routed experts on every `decoder_sparse_step`-th layer not in mlp_only_layers."""
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    dense = set(cfg.get("mlp_only_layers") or ())
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(n))


class Qwen2Moe(CausalLM):
    name = "qwen2_moe"
    hf_architectures = ("Qwen2MoeForCausalLM",)
    gguf_architectures = ("qwen2moe",)
    config_class = Qwen2MoeConfig
    qk_norm = False  # Qwen3-MoE: per-head q/k norms and no q/k/v biases
    renormalize = False  # norm_topk_prob when the config does not say (llama.cpp fixes it per architecture)

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str):
        check_activation(cfg, where, ("silu", "swish"))
        fields = hf_fields(cfg, where, cls.name)
        shared = int(cfg.get("shared_expert_intermediate_size") or 0)
        return cls.config_class(**fields, qkv_bias=not cls.qk_norm or bool(cfg.get("attention_bias", False)),
                                o_bias=cls.qk_norm and bool(cfg.get("attention_bias", False)), qk_norm=cls.qk_norm,
                                num_experts=int(cfg.get("num_experts") or cfg["num_local_experts"]),
                                num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                                moe_intermediate_size=int(cfg["moe_intermediate_size"]),
                                norm_topk_prob=bool(cfg.get("norm_topk_prob", cls.renormalize)),
                                shared_intermediate_size=shared, moe_layers=moe_layer_flags(cfg, fields["num_layers"]))

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str):
        fields = gguf_fields(meta, cls.name)
        n = fields["num_layers"]
        return cls.config_class(**fields, qkv_bias=meta.has("blk.0.attn_q.bias"), o_bias=meta.has("blk.0.attn_output.bias"),
                                qk_norm=meta.has("blk.0.attn_q_norm.weight"),
                                num_experts=int(meta.key("expert_count", required=True)),
                                num_experts_per_tok=int(meta.key("expert_used_count", required=True)),
                                moe_intermediate_size=int(meta.key("expert_feed_forward_length", required=True)),
                                norm_topk_prob=cls.renormalize,
                                shared_intermediate_size=int(meta.key("expert_shared_feed_forward_length", 0) or 0),
                                moe_layers=tuple(meta.has(f"blk.{i}.ffn_gate_inp.weight") for i in range(n)))

    @classmethod
    def layer_weights(cls, c: Qwen2MoeConfig, i: int):
        hf, gg, d = f"model.layers.{i}", f"blk.{i}", c.hidden_size
        out = {
            "attn_norm": norm(d, f"{hf}.input_layernorm.weight", f"{gg}.attn_norm.weight"),
            **attention_weights(c, hf=f"{hf}.self_attn", gguf=gg),
            "mlp_norm": norm(d, f"{hf}.post_attention_layernorm.weight", f"{gg}.ffn_norm.weight"),
        }
        if not c.is_moe(i):
            return {**out, **mlp_weights(d, c.intermediate_size, hf=f"{hf}.mlp", gguf=gg)}
        return {**out, **qwen_moe_weights(c, hf, gg, shared_gate=c.shared_expert_gate)}

    def layer(self, i, x, w, cache, ctx):
        c = self.config
        h, cache = attention(c, i, rms_norm(x, w["attn_norm"], c.rms_norm_eps), w, cache, ctx)
        x = x + h
        h = rms_norm(x, w["mlp_norm"], c.rms_norm_eps)
        return x + (routed_and_shared(self, h, w) if c.is_moe(i) else mlp(h, w)), cache
