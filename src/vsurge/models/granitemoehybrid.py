"""Granite 4.0-H (GraniteMoeHybrid): Mamba-2 layers on most layers (e.g. 9 in 10), grouped-query
attention on the rest, every layer's MLP a shared gated MLP plus (the MoE models) routed experts;
Granite 3's four multipliers (embeddings, residual branches, attention scores, logits).

Mamba-2 layer (D hidden; H heads of P dims, I = H*P = mamba_expand*D; G groups of N state dims):
    in_proj (I + Cv + H, D) = z (I) gate | xBC (Cv = I + 2*G*N) | dt (H)     [+ bias]
    conv1d (Cv, 1, K) depthwise causal [+ bias (Cv,)]   dt_bias, A_log, D (H,)   norm (I,)
    out_proj (D, I) [+ bias]
    xBC = silu(causal_conv(xBC)) -> x (H, P), B (G, N), C (G, N); A = -exp(A_log);
    dt = softplus(dt + dt_bias), clamped to time_step_limit on prompts (the reference's decode step
    does not clamp); y = SSD(x, dt, A, B, C) + D*x (ops/ssd.py); grouped gated RMSNorm of (y, z)
    in G groups; out_proj. State per sequence and layer: the conv window (K-1, Cv) and the SSM
    state (H, P, N) (kv/recurrent.py).
Attention layer: q/k/v/o (biases with attention_bias), scores scaled by attention_multiplier;
rotary only with position_embedding_type "rope" (the released Granite 4.0-H checkpoints: "nope").
MLP: shared_mlp.input_linear (2Fs, D) = gate | up, output_linear (D, Fs); experts (when
num_local_experts > 0) block_sparse_moe.input_linear (E, 2F, D) = gate | up, output_linear
(E, D, F), router.layer (E, D): top-k of the logits, softmax over those k.

HF: GraniteMoeHybridForCausalLM ("granitemoehybrid"); GGUF: not yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import AttentionSpec
from ..ops.moe import Routing
from ..ops.norm import rms_norm
from .base import CausalLM
from .blocks import attention, attention_weights, mlp, norm
from .config_io import check_activation, hf_fields
from .mamba2 import Mamba2Config, mamba2_fields, mamba2_mixer, mamba2_weights
from .moe import MoEConfig, expert_axes, router_weights, routed
from .spec import GateUp, Weight, tensor

MAMBA_KINDS = ("mamba", "linear_attention")  # HF layer_types: transformers 4 / 5 spelling


@dataclass(frozen=True)
class GraniteMoeHybridConfig(Mamba2Config, MoEConfig):
    mamba_layers: tuple[bool, ...] = ()  # per layer: Mamba-2 (True) or attention
    use_rope: bool = False  # position_embedding_type "rope" (else attention without positions)
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    logits_scaling: float = 1.0

    def layer_kind(self, layer: int) -> str:
        return "mamba2" if self.mamba_layers[layer] else "attention"

    def is_moe(self, layer: int) -> bool:
        return self.num_experts > 0

    @property
    def routing(self) -> Routing:
        return Routing(self.num_experts, self.num_experts_per_tok, scoring="topk_softmax")

    def layer_rope(self, layer: int):
        return self.rope if self.use_rope and not self.mamba_layers[layer] else None

    def attention_spec(self, layer: int) -> AttentionSpec:
        return AttentionSpec(scale=self.attention_multiplier)



class GraniteMoeHybrid(CausalLM):
    name = "granitemoehybrid"
    hf_model_types = ("granitemoehybrid",)
    hf_architectures = ("GraniteMoeHybridForCausalLM",)
    config_class = GraniteMoeHybridConfig

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str):
        check_activation(cfg, where, ("silu", "swish"))
        fields = hf_fields(cfg, where, cls.name)
        n, d = fields["num_layers"], fields["hidden_size"]
        types = cfg.get("layer_types") or cfg.get("layers_block_type") or ["mamba"] * n
        experts = int(cfg.get("num_local_experts") or 0)
        return cls.config_class(
            **{**fields, "qkv_bias": bool(cfg.get("attention_bias")), "o_bias": bool(cfg.get("attention_bias"))},
            num_experts=experts, num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 1),
            moe_intermediate_size=fields["intermediate_size"],
            shared_intermediate_size=int(cfg.get("shared_intermediate_size") or 0),
            mamba_layers=tuple(t in MAMBA_KINDS for t in types[:n]), **mamba2_fields(cfg, where, d),
            use_rope=cfg.get("position_embedding_type") == "rope",
            **{k: float(cfg.get(k) or 1.0) for k in
               ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")})

    # ------------------------------------------------------------ weights
    @classmethod
    def layer_weights(cls, c: GraniteMoeHybridConfig, i: int):
        hf, d = f"model.layers.{i}", c.hidden_size
        out = {"attn_norm": norm(d, f"{hf}.input_layernorm.weight", None),
               "mlp_norm": norm(d, f"{hf}.post_attention_layernorm.weight", None)}
        out.update(mamba2_weights(c, f"{hf}.mamba") if c.mamba_layers[i]
                   else attention_weights(c, hf=f"{hf}.self_attn", gguf=None))
        fs, shared = c.shared_intermediate_size, f"{hf}.shared_mlp"
        out["shared_gate_up"] = Weight((d, 2 * fs), ("embed", "mlp"),
                                       _gate_up(f"{shared}.input_linear.weight", (2 * fs, d)), quantize=True)
        out["shared_down"] = Weight((fs, d), ("mlp", "embed"), tensor(f"{shared}.output_linear.weight", (d, fs)),
                                    quantize=True)
        if c.is_moe(i):
            e, f, moe = c.num_experts, c.moe_intermediate_size, f"{hf}.block_sparse_moe"
            out.update(router_weights(c, f"{moe}.router.layer", None))
            out["experts_gate_up"] = Weight((e, d, 2 * f), expert_axes(c, "gate_up"),
                                            _gate_up(f"{moe}.input_linear.weight", (e, 2 * f, d)), indexed=True)
            out["experts_down"] = Weight((e, f, d), expert_axes(c, "down"),
                                         tensor(f"{moe}.output_linear.weight", (e, d, f)), indexed=True)
        return out

    # ------------------------------------------------------------ forward
    @property
    def embed_scale(self) -> float:
        return self.config.embedding_multiplier

    def scale_logits(self, logits):
        return logits / self.config.logits_scaling

    def layer(self, i, x, w, cache, ctx):
        c = self.config
        h = rms_norm(x, w["attn_norm"], c.rms_norm_eps)
        if c.mamba_layers[i]:
            h, cache = mamba2_mixer(c, i, h, w, cache, ctx.positions)
        else:
            h, cache = attention(c, i, h, w, cache, ctx)
        x = x + h * c.residual_multiplier
        h = rms_norm(x, w["mlp_norm"], c.rms_norm_eps)
        out = mlp(h, w, prefix="shared")
        if c.is_moe(i):
            out = routed(self, h, w) + out
        return x + out * c.residual_multiplier, cache


def _gate_up(name: str, shape: tuple[int, ...]) -> GateUp:
    """A stored (..., 2F, D) = gate rows | up rows -> the model's (..., D, 2F) interleaved."""
    f = shape[-2] // 2
    return GateUp(tensor(name, shape, rows=(0, f)), tensor(name, shape, rows=(f, 2 * f)))
