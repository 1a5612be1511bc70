"""Gemma 2: alternating sliding-window (even layers) and global layers, tanh soft-capping of
attention scores and final logits, a norm before and after both attention and MLP, GeGLU,
embeddings scaled by sqrt(D), scores scaled by query_pre_attn_scalar**-0.5.

HF: Gemma2ForCausalLM ("gemma2"); RMSNorm multiplies by 1 + w (stored w: 1 added at load;
llama.cpp's converter stores 1 + w already). GGUF: `gemma2`.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp

from ...config import AttentionSpec, ModelConfig, Rope
from ...errors import UnsupportedModelError
from ...ops.norm import rms_norm
from ..parts.base import CausalLM
from ..parts.blocks import attention, attention_weights, mlp, mlp_weights, norm
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields, hf_layer_types

GELU = ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new", "gelu")


@dataclass(frozen=True)
class GemmaConfig(ModelConfig):
    query_pre_attn_scalar: float = 256.0
    attn_softcap: float | None = None
    final_softcap: float | None = None
    activation: str = "gelu_pytorch_tanh"
    local_rope: Rope | None = None  # Gemma 3: the sliding layers' own rotary base

    def layer_rope(self, layer: int) -> Rope | None:
        if self.local_rope is not None and self.is_sliding(layer):
            return self.local_rope
        return self.rope

    def attention_spec(self, layer: int) -> AttentionSpec:
        return AttentionSpec(scale=self.query_pre_attn_scalar ** -0.5,
                             window=self.sliding_window if self.is_sliding(layer) else None,
                             softcap=self.attn_softcap)


def alternating(num_layers: int, pattern: int) -> tuple[str, ...]:
    """Layers 0..pattern-2 of every `pattern` slide, the last one is global."""
    return tuple("sliding" if (i + 1) % pattern else "full" for i in range(num_layers))


def gguf_query_scalar(meta: GGUFMeta, fields: dict, big_model_layers: int) -> float:
    """llama.cpp derives Gemma's query scale from the model size: the 27B scales by D / H, the
    others by head_dim (no metadata key holds it)."""
    if fields["num_layers"] == big_model_layers:
        return fields["hidden_size"] / fields["num_heads"]
    return float(fields["head_dim"])


class Gemma2(CausalLM):
    supports_lora = True  # (models/parts/base.py)
    name = "gemma2"
    hf_architectures = ("Gemma2ForCausalLM",)
    gguf_architectures = ("gemma2",)
    config_class = GemmaConfig
    sliding_pattern = 2

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str) -> ModelConfig:
        act = check_activation(cfg, where, GELU, key="hidden_activation" if cfg.get("hidden_activation") else "hidden_act")
        if cfg.get("use_bidirectional_attention"):
            raise UnsupportedModelError(f"{where}: bidirectional attention (an embedding model) is not supported")
        fields = hf_fields(cfg, where, cls.name)
        bias = bool(cfg.get("attention_bias", False))
        window = cfg.get("sliding_window")
        types = hf_layer_types(cfg, fields["num_layers"]) or alternating(
            fields["num_layers"], int(cfg.get("sliding_window_pattern", cls.sliding_pattern)))
        fields.update(qkv_bias=bias, o_bias=bias, sliding_window=int(window) if window else None, layer_types=types,
                      activation=act, query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar") or fields["head_dim"]),
                      attn_softcap=cfg.get("attn_logit_softcapping"), final_softcap=cfg.get("final_logit_softcapping"))
        return cls.config_class(**{**fields, **cls.hf_extra(cfg, fields)})

    @classmethod
    def hf_extra(cls, cfg: dict, fields: dict) -> dict:
        return {}

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str) -> ModelConfig:
        fields = gguf_fields(meta, cls.name)
        window = meta.key("attention.sliding_window")
        pattern = meta.key("attention.sliding_window_pattern", cls.sliding_pattern)
        types = (tuple("sliding" if s else "full" for s in pattern) if isinstance(pattern, list)
                 else alternating(fields["num_layers"], int(pattern)))
        fields.update(sliding_window=int(window) if window else None, layer_types=types if window else None,
                      query_pre_attn_scalar=gguf_query_scalar(meta, fields, 46),
                      attn_softcap=meta.key("attn_logit_softcapping") or None,
                      final_softcap=meta.key("final_logit_softcapping") or None)
        return cls.config_class(**{**fields, **cls.gguf_extra(meta, fields)})

    @classmethod
    def gguf_extra(cls, meta: GGUFMeta, fields: dict) -> dict:
        return {}

    @classmethod
    def global_weights(cls, config):
        out = super().global_weights(config)
        d = config.hidden_size
        out["final_norm"] = norm(d, "model.norm.weight", "output_norm.weight", hf_offset=1.0)
        return out

    @classmethod
    def layer_weights(cls, c: ModelConfig, i: int):
        hf, gg, d = f"model.layers.{i}", f"blk.{i}", c.hidden_size

        def n(hf_name, gguf_name):
            return norm(d, f"{hf}.{hf_name}.weight", f"{gg}.{gguf_name}.weight", hf_offset=1.0)

        return {
            "attn_norm": n("input_layernorm", "attn_norm"),
            **attention_weights(c, hf=f"{hf}.self_attn", gguf=gg, qk_norm_offset=1.0),
            "post_attn_norm": n("post_attention_layernorm", "post_attention_norm"),
            "mlp_norm": n("pre_feedforward_layernorm", "ffn_norm"),
            **mlp_weights(d, c.intermediate_size, hf=f"{hf}.mlp", gguf=gg),
            "post_mlp_norm": n("post_feedforward_layernorm", "post_ffw_norm"),
        }

    @property
    def embed_scale(self) -> float:
        return self.config.hidden_size ** 0.5

    def layer(self, i, x, w, cache, ctx):
        c = self.config
        h, cache = attention(c, i, rms_norm(x, w["attn_norm"], c.rms_norm_eps), w, cache, ctx)
        x = x + rms_norm(h, w["post_attn_norm"], c.rms_norm_eps)
        h = mlp(rms_norm(x, w["mlp_norm"], c.rms_norm_eps), w, c.activation)
        return x + rms_norm(h, w["post_mlp_norm"], c.rms_norm_eps), cache

    def scale_logits(self, logits):
        cap = self.config.final_softcap
        return logits if cap is None else cap * jnp.tanh(logits / cap)
