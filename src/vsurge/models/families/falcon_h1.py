"""TII Falcon-H1: every layer runs a Mamba-2 mixer and grouped-query attention side by side on the
same normed input and adds both to the residual, then a gated MLP; muP multipliers throughout.

Layer (D hidden; the mixer of models/parts/mamba2.py with I = mamba_d_ssm, or mamba_expand * D):
    h = input_layernorm(x)
    x = x + ssm_out_multiplier * mamba(ssm_in_multiplier * h)      in_proj outputs z | x | B | C | dt
                                                                   times ssm_multipliers (muP)
          + attention_out_multiplier * attn(attention_in_multiplier * h)   k times key_multiplier
    x = x + down_multiplier * down(silu(gate_multiplier * gate(h')) * up(h'))   h' = pre_ff_layernorm(x)
The mixer's gated RMSNorm is optional (mamba_rms_norm; without it y * silu(z)) and normalises before
gating (mamba_norm_before_gate). Embeddings times embedding_multiplier, logits times
lm_head_multiplier. The key multiplier scales every score, so it is folded into the attention scale
(keys are cached unscaled). State per sequence and layer: each layer has both a KV entry and a
Mamba-2 state (layer kind "attention+mamba2").

HF: FalconH1ForCausalLM ("falcon_h1"). GGUF: `falcon-h1` as llama.cpp's converter writes it: every muP
multiplier folded into the weights (the embeddings, the head, q/k/v, the mixer's in_proj rows and
out_proj, the MLP's gate and down), so the file's model runs with every multiplier 1; the mixer's
tensors as models/parts/mamba2.py maps them; its gated norm, where the file has one, normalises after
gating (llama.cpp's Mamba-2; the file does not say).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax

from ...config import AttentionSpec
from ...errors import UnsupportedModelError
from ...ops.linear import linear
from ...ops.mlp import split_gate_up
from ...ops.norm import rms_norm
from ..parts.base import CausalLM
from ..parts.blocks import attention, attention_weights, mlp_weights, norm
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields
from ..parts.mamba2 import Mamba2Config, mamba2_fields, mamba2_gguf_fields, mamba2_mixer, mamba2_weights


@dataclass(frozen=True)
class FalconH1Config(Mamba2Config):
    ssm_out_multiplier: float = 1.0
    attention_in_multiplier: float = 1.0
    attention_out_multiplier: float = 1.0
    key_multiplier: float = 1.0
    mlp_multipliers: tuple[float, float] = (1.0, 1.0)  # gate, down
    embedding_multiplier: float = 1.0
    lm_head_multiplier: float = 1.0

    def layer_kind(self, layer: int) -> str:
        return "attention+mamba2"

    def attention_spec(self, layer: int) -> AttentionSpec:
        return AttentionSpec(scale=self.head_dim**-0.5 * self.key_multiplier)



class FalconH1(CausalLM):
    name = "falcon_h1"
    hf_architectures = ("FalconH1ForCausalLM",)
    config_class = FalconH1Config
    gguf_architectures = ("falcon-h1",)

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str):
        check_activation(cfg, where, ("silu", "swish"))
        fields = hf_fields(cfg, where, cls.name)
        if cfg.get("attention_bias") or cfg.get("mlp_bias"):
            raise UnsupportedModelError(f"{where}: attention_bias / mlp_bias are not supported")
        scalars = ("ssm_in_multiplier", "ssm_out_multiplier", "attention_in_multiplier", "attention_out_multiplier",
                   "key_multiplier", "embedding_multiplier", "lm_head_multiplier")
        return cls.config_class(
            **fields, **mamba2_fields(cfg, where, fields["hidden_size"]),
            mamba_out_bias=bool(cfg.get("projectors_bias", False)),
            mamba_rms_norm=bool(cfg.get("mamba_rms_norm", False)),
            mamba_norm_before_gate=bool(cfg.get("mamba_norm_before_gate", True)),
            ssm_multipliers=tuple(float(m) for m in cfg.get("ssm_multipliers") or (1.0,) * 5),
            mlp_multipliers=tuple(float(m) for m in cfg.get("mlp_multipliers") or (1.0, 1.0)),
            **{k: float(cfg[k]) if cfg.get(k) is not None else 1.0 for k in scalars})

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str):
        return cls.config_class(**gguf_fields(meta, cls.name), **mamba2_gguf_fields(meta),
                                mamba_rms_norm=meta.has_any("ssm_norm.weight"), mamba_norm_before_gate=False)

    @classmethod
    def global_weights(cls, config):
        out = super().global_weights(config)
        out["final_norm"] = norm(config.hidden_size, "model.final_layernorm.weight", "output_norm.weight")
        return out

    # ------------------------------------------------------------ weights
    @classmethod
    def layer_weights(cls, c: FalconH1Config, i: int):
        hf, gg, d = f"model.layers.{i}", f"blk.{i}", c.hidden_size
        return {"attn_norm": norm(d, f"{hf}.input_layernorm.weight", f"{gg}.attn_norm.weight"),
                "mlp_norm": norm(d, f"{hf}.pre_ff_layernorm.weight", f"{gg}.ffn_norm"),  # (no .weight in GGUF)
                **attention_weights(c, hf=f"{hf}.self_attn", gguf=gg),
                **mamba2_weights(c, f"{hf}.mamba", gg),
                **mlp_weights(d, c.intermediate_size, hf=f"{hf}.feed_forward", gguf=gg)}

    # ------------------------------------------------------------ forward
    @property
    def embed_scale(self) -> float:
        return self.config.embedding_multiplier

    def scale_logits(self, logits):
        return logits * self.config.lm_head_multiplier

    def layer(self, i, x, w, cache, ctx):
        c = self.config
        h = rms_norm(x, w["attn_norm"], c.rms_norm_eps)
        ssm, cache = mamba2_mixer(c, i, h, w, cache, ctx.positions)
        attn, cache = attention(c, i, h * c.attention_in_multiplier, w, cache, ctx)
        x = x + (ssm * c.ssm_out_multiplier + attn * c.attention_out_multiplier)
        h = rms_norm(x, w["mlp_norm"], c.rms_norm_eps)
        gate, up = split_gate_up(linear(h, w["w_gate_up"], w.get("w_gate_up_scale")))  # (B, T, F) each
        y = jax.nn.silu(gate * c.mlp_multipliers[0]) * up
        return x + linear(y, w["w_down"], w.get("w_down_scale")) * c.mlp_multipliers[1], cache
