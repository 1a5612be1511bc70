"""Llama 2 / 3.x (and SmolLM2, Llama-shaped fine-tunes): pre-norm decoder, grouped-query
attention, SwiGLU. The base most dense families extend (mistral.py, qwen2.py, granite.py, ...).

HF: LlamaForCausalLM (model_type "llama"); GGUF: `llama` (q/k rows stored in llama.cpp's
interleaved rotary layout, un-permuted at load; Llama 3.1 scaling as `rope_freqs.weight`).
"""

from __future__ import annotations

from ...config import ModelConfig
from ...errors import UnsupportedModelError
from ..parts.base import CausalLM
from ..parts.blocks import attention_weights, mlp_weights, norm, pre_norm_layer
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields


class Llama(CausalLM):
    supports_lora = True  # (models/parts/base.py)
    name = "llama"
    hf_architectures = ("LlamaForCausalLM",)
    gguf_architectures = ("llama",)
    gguf_config_tensors = ("rope_freqs.weight",)
    gguf_permuted_qk = True  # llama.cpp's converter interleaves q/k rows for this architecture

    @classmethod
    def accepts_gguf(cls, meta: GGUFMeta) -> bool:
        return not meta.key("expert_count")  # llama.cpp writes Mixtral as `llama` with experts (mixtral.py)

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str) -> ModelConfig:
        check_activation(cfg, where, ("silu", "swish"))
        if cfg.get("mlp_bias"):
            raise UnsupportedModelError(f"{where}: mlp_bias=true is not supported")
        bias = bool(cfg.get("attention_bias", False))
        fields = hf_fields(cfg, where, cls.name)
        return cls.config_class(**fields, qkv_bias=bias, o_bias=bias, **cls.hf_extra(cfg, fields))

    @classmethod
    def hf_extra(cls, cfg: dict, fields: dict) -> dict:
        """Family fields beyond Llama's (subclasses)."""
        return {}

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str) -> ModelConfig:
        window = meta.key("attention.sliding_window")
        return cls.config_class(**gguf_fields(meta, cls.name), qkv_bias=meta.has("blk.0.attn_q.bias"),
                                o_bias=meta.has("blk.0.attn_output.bias"), qk_norm=meta.has("blk.0.attn_q_norm.weight"),
                                sliding_window=int(window) if window else None)

    @classmethod
    def layer_weights(cls, c: ModelConfig, i: int):
        hf, gg = f"model.layers.{i}", f"blk.{i}"
        d = c.hidden_size
        return {
            "attn_norm": norm(d, f"{hf}.input_layernorm.weight", f"{gg}.attn_norm.weight"),
            **attention_weights(c, hf=f"{hf}.self_attn", gguf=gg, permuted_qk=cls.gguf_permuted_qk),
            "mlp_norm": norm(d, f"{hf}.post_attention_layernorm.weight", f"{gg}.ffn_norm.weight"),
            **mlp_weights(d, c.intermediate_size, hf=f"{hf}.mlp", gguf=gg),
        }

    def layer(self, i, x, w, cache, ctx):
        return pre_norm_layer(self.config, i, x, w, cache, ctx)

