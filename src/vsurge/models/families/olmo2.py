"""OLMo 2 / OLMo 3: norms after attention and after the MLP (none before), RMSNorm of q and k
over all heads at once; OLMo 3 adds sliding-window layers (three of every four).

HF: Olmo2ForCausalLM ("olmo2"), Olmo3ForCausalLM ("olmo3"); GGUF: `olmo2` (q/k not permuted).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import ModelConfig
from ...ops.norm import rms_norm
from ..parts.base import CausalLM
from ..parts.blocks import attention, attention_weights, mlp, mlp_weights, norm
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields, hf_layer_types


@dataclass(frozen=True)
class Olmo2Config(ModelConfig):
    def for_tensor_parallel(self, tp: int) -> ModelConfig:
        # k's norm spans every KV head, so KV heads cannot be replicated to fit the mesh
        if self.num_kv_heads % tp:
            raise ValueError(f"tensor_parallel_size {tp} must divide the model's {self.num_kv_heads} KV heads "
                             f"(OLMo 2 normalizes k over all of them)")
        return super().for_tensor_parallel(tp)


class Olmo2(CausalLM):
    supports_lora = True  # (models/parts/base.py)
    name = "olmo2"
    config_class = Olmo2Config
    hf_model_types = ("olmo2", "olmo3")
    hf_architectures = ("Olmo2ForCausalLM", "Olmo3ForCausalLM")
    gguf_architectures = ("olmo2",)

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str) -> ModelConfig:
        check_activation(cfg, where, ("silu", "swish"))
        fields = hf_fields(cfg, where, cls.name)
        bias = bool(cfg.get("attention_bias", False))
        window = cfg.get("sliding_window") if cfg.get("model_type") == "olmo3" else None
        types = hf_layer_types(cfg, fields["num_layers"]) if window else None
        if window and types is None:
            types = tuple("sliding" if (i + 1) % 4 else "full" for i in range(fields["num_layers"]))
        return Olmo2Config(**fields, qkv_bias=bias, o_bias=bias, qk_norm=True,
                           sliding_window=int(window) if window else None, layer_types=types)

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str) -> ModelConfig:
        fields = gguf_fields(meta, cls.name)
        window = meta.key("attention.sliding_window")
        pattern = meta.key("attention.sliding_window_pattern")
        types = tuple("sliding" if s else "full" for s in pattern) if window and isinstance(pattern, list) else None
        return Olmo2Config(**fields, qk_norm=True, sliding_window=int(window) if window else None, layer_types=types)

    @classmethod
    def layer_weights(cls, c: ModelConfig, i: int):
        hf, gg, d = f"model.layers.{i}", f"blk.{i}", c.hidden_size
        return {
            **attention_weights(c, hf=f"{hf}.self_attn", gguf=gg, qk_norm_width="all"),
            "post_attn_norm": norm(d, f"{hf}.post_attention_layernorm.weight", f"{gg}.post_attention_norm.weight"),
            **mlp_weights(d, c.intermediate_size, hf=f"{hf}.mlp", gguf=gg),
            "post_mlp_norm": norm(d, f"{hf}.post_feedforward_layernorm.weight", f"{gg}.post_ffw_norm.weight"),
        }

    def layer(self, i, x, w, cache, ctx):
        c = self.config
        h, cache = attention(c, i, x, w, cache, ctx, qk_norm_width="all")
        x = x + rms_norm(h, w["post_attn_norm"], c.rms_norm_eps)
        return x + rms_norm(mlp(x, w), w["post_mlp_norm"], c.rms_norm_eps), cache
