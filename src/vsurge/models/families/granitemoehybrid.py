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

HF: GraniteMoeHybridForCausalLM ("granitemoehybrid"). GGUF: `granitehybrid` as llama.cpp's converter
writes it: the mixer's ssm_* tensors (models/parts/mamba2.py), q/k rows interleaved for llama.cpp's rotary,
the shared MLP split into ffn_{gate,up,down}_shexp (ffn_{gate,up,down} without experts), the experts
into ffn_{gate,up,down}_exps; which layers attend from the per-layer `attention.head_count_kv` (0 on a
Mamba-2 layer); rotary only where `rope.scaling.finetuned` says so (the converter writes false for
every hybrid, and llama.cpp then runs no rotary).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import AttentionSpec
from ...ops.moe import Routing
from ...ops.norm import rms_norm
from ..parts.base import CausalLM
from ..parts.blocks import attention, attention_weights, mlp, norm
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields
from ..parts.mamba2 import Mamba2Config, mamba2_fields, mamba2_gguf_fields, mamba2_mixer, mamba2_weights
from ..parts.moe import MoEConfig, expert_axes, router_weights, routed
from ..parts.spec import GateUp, Weight, paired, tensor

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
    hf_architectures = ("GraniteMoeHybridForCausalLM",)
    config_class = GraniteMoeHybridConfig
    gguf_architectures = ("granitehybrid",)

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

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str):
        fields = gguf_fields(meta, cls.name)
        n, experts = fields["num_layers"], int(meta.key("expert_count", 0) or 0)
        kv_heads = [int(h) for h in meta.per_layer("attention.head_count_kv", n)]  # 0: a Mamba-2 layer
        attending = [h for h in kv_heads if h]
        # the shared MLP's width: its own key with experts, else the dense MLP's tensor
        shared = (int(meta.key("expert_shared_feed_forward_length", 0) or 0) if experts
                  else meta.tensors["blk.0.ffn_gate.weight"][0])
        return cls.config_class(
            **{**fields, "num_kv_heads": attending[0] if attending else fields["num_heads"]},
            qkv_bias=meta.has_any("attn_q.bias"), o_bias=meta.has_any("attn_output.bias"),
            num_experts=experts, num_experts_per_tok=int(meta.key("expert_used_count", 1) or 1),
            moe_intermediate_size=fields["intermediate_size"], shared_intermediate_size=shared,
            mamba_layers=tuple(h == 0 for h in kv_heads), **mamba2_gguf_fields(meta),
            use_rope=bool(meta.key("rope.scaling.finetuned", True)),
            embedding_multiplier=float(meta.key("embedding_scale", 1.0)),
            residual_multiplier=float(meta.key("residual_scale", 1.0)),
            attention_multiplier=float(meta.key("attention.scale", fields["head_dim"] ** -0.5)),
            logits_scaling=float(meta.key("logit_scale", 1.0)))

    # ------------------------------------------------------------ weights
    @classmethod
    def layer_weights(cls, c: GraniteMoeHybridConfig, i: int):
        hf, gg, d = f"model.layers.{i}", f"blk.{i}", c.hidden_size
        out = {"attn_norm": norm(d, f"{hf}.input_layernorm.weight", f"{gg}.attn_norm.weight"),
               "mlp_norm": norm(d, f"{hf}.post_attention_layernorm.weight", f"{gg}.ffn_norm.weight")}
        out.update(mamba2_weights(c, f"{hf}.mamba", gg) if c.mamba_layers[i]
                   else attention_weights(c, hf=f"{hf}.self_attn", gguf=gg, permuted_qk=True))
        fs, shared, s = c.shared_intermediate_size, f"{hf}.shared_mlp", "_shexp" if c.num_experts else ""
        out["shared_gate_up"] = Weight((d, 2 * fs), ("embed", "mlp"),
                                       _gate_up(f"{shared}.input_linear.weight", (2 * fs, d)),
                                       GateUp(tensor(f"{gg}.ffn_gate{s}.weight", (fs, d)),
                                              tensor(f"{gg}.ffn_up{s}.weight", (fs, d))), quantize=True)
        out["shared_down"] = Weight((fs, d), ("mlp", "embed"), *paired(f"{shared}.output_linear.weight",
                                                                       f"{gg}.ffn_down{s}.weight", (d, fs)),
                                    quantize=True)
        if c.is_moe(i):
            e, f, moe = c.num_experts, c.moe_intermediate_size, f"{hf}.block_sparse_moe"
            out.update(router_weights(c, f"{moe}.router.layer", f"{gg}.ffn_gate_inp"))
            out["experts_gate_up"] = Weight((e, d, 2 * f), expert_axes(c, "gate_up"),
                                            _gate_up(f"{moe}.input_linear.weight", (e, 2 * f, d)),
                                            GateUp(tensor(f"{gg}.ffn_gate_exps.weight", (e, f, d)),
                                                   tensor(f"{gg}.ffn_up_exps.weight", (e, f, d))), indexed=True)
            out["experts_down"] = Weight((e, f, d), expert_axes(c, "down"),
                                         *paired(f"{moe}.output_linear.weight", f"{gg}.ffn_down_exps.weight",
                                                 (e, d, f)), indexed=True)
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
