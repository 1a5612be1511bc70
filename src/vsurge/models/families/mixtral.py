"""Mixtral: Llama's attention (sliding window when set) with a top-k routed SwiGLU mixture of
experts in place of the MLP; the k router probabilities renormalized.

HF: MixtralForCausalLM ("mixtral"; experts as block_sparse_moe.experts.N.w1/w3/w2);
GGUF: llama.cpp writes Mixtral as `llama` with an expert count (stacked *_exps tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ops.norm import rms_norm
from ..parts.blocks import attention, attention_weights, norm
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields
from .llama import Llama
from ..parts.moe import MoEConfig, expert_weights, router_weights, routed


@dataclass(frozen=True)
class MixtralConfig(MoEConfig):
    pass


class Mixtral(Llama):
    name = "mixtral"
    hf_architectures = ("MixtralForCausalLM",)
    gguf_architectures = ("llama",)
    config_class = MixtralConfig

    @classmethod
    def accepts_gguf(cls, meta: GGUFMeta) -> bool:
        return bool(meta.key("expert_count"))

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str):
        check_activation(cfg, where, ("silu", "swish"))
        fields = hf_fields(cfg, where, cls.name)
        window = cfg.get("sliding_window")
        return MixtralConfig(**fields, sliding_window=int(window) if window else None,
                             num_experts=int(cfg["num_local_experts"]), num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                             moe_intermediate_size=fields["intermediate_size"], norm_topk_prob=True)

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str):
        fields = gguf_fields(meta, cls.name)
        window = meta.key("attention.sliding_window")
        ff = meta.key("expert_feed_forward_length") or fields["intermediate_size"]
        return MixtralConfig(**fields, sliding_window=int(window) if window else None,
                             num_experts=int(meta.key("expert_count")), num_experts_per_tok=int(meta.key("expert_used_count")),
                             moe_intermediate_size=int(ff), norm_topk_prob=True)

    @classmethod
    def layer_weights(cls, c: MixtralConfig, i: int):
        hf, gg, d = f"model.layers.{i}", f"blk.{i}", c.hidden_size
        moe = f"{hf}.block_sparse_moe"
        kinds = {"gate": "w1", "up": "w3", "down": "w2"}
        return {
            "attn_norm": norm(d, f"{hf}.input_layernorm.weight", f"{gg}.attn_norm.weight"),
            **attention_weights(c, hf=f"{hf}.self_attn", gguf=gg, permuted_qk=True),
            "mlp_norm": norm(d, f"{hf}.post_attention_layernorm.weight", f"{gg}.ffn_norm.weight"),
            **router_weights(c, f"{moe}.gate", f"{gg}.ffn_gate_inp"),
            **expert_weights(c, hf_expert=lambda e, kind: f"{moe}.experts.{e}.{kinds[kind]}.weight", gguf=gg),
        }

    def layer(self, i, x, w, cache, ctx):
        c = self.config
        h, cache = attention(c, i, rms_norm(x, w["attn_norm"], c.rms_norm_eps), w, cache, ctx)
        x = x + h
        return x + routed(self, rms_norm(x, w["mlp_norm"], c.rms_norm_eps), w), cache
